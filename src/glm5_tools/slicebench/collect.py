"""One run of the serving slice as results.json and a row of docs/validation/serving-slice.md.

Reads what the GPU-machine steps left (tools/gpu/run): the slice's manifest (layers),
the machine file (card, measured copy bandwidth), bench.yml's run directories
(``summary.json``: the points' figures, the server's /metrics view, llama.cpp's points of
the side-by-side, or llama.cpp's own bench.yml runs at the same points) and the profiler
captures (``<capture>/trace.json.gz`` + ``meta.json``, classified here), and writes
results.json (everything, the projection included), profile.md (ms per step by class)
and row.md (the table row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glm5_tools.slicebench import classify, project


def load_bench(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"run": summary.get("run", run_dir.name), "points": summary["points"],
            "llama_cpp": summary.get("llama_cpp", []), "server": summary.get("server", {}),
            "skipped": summary.get("skipped", [])}


def load_profile(prof_dir: Path, vocab: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for meta_path in sorted(prof_dir.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        traces = sorted(meta_path.parent.glob("trace.json*"))
        if not traces:
            continue
        table = classify.classify(traces[0])
        # the tokens the profiled steps scheduled (their annotations), else the capture's plan
        # (a prefill chunk may be shorter than planned: a prefix-cache hit)
        out[meta["label"]] = {**table, "kind": meta["kind"], "batch": meta["batch"],
                              "tokens_per_step": table.get("median_tokens") or meta["tokens_per_step"],
                              "tokens_per_step_planned": meta["tokens_per_step"], "vocab": vocab}
    return out


def collect(*, slice_manifest: Path, machine: Path, bench_dirs: list[Path], profile_dir: Path | None,
            variant: str, mtp: int, commit: str, date: str, llama_dirs: list[Path] | None = None) -> dict[str, Any]:
    manifest = json.loads(slice_manifest.read_text())
    cfg = manifest["recipe"]["config"]
    results: dict[str, Any] = {
        "date": date, "commit": commit, "variant": variant, "mtp": mtp,
        "layers": manifest["layers"], "real_layers": manifest["real_layers"], "vocab": cfg["vocab_size"],
        "slice_bytes": manifest["file_bytes"],
        "device": json.loads(machine.read_text()),
        "bench": [load_bench(d) for d in bench_dirs],
        # llama.cpp's llama-server on the same GGUF and points, as a bench.yml run of its own
        "llama_cpp": [load_bench(d) for d in llama_dirs or []],
        "profile": load_profile(profile_dir, cfg["vocab_size"]) if profile_dir and profile_dir.is_dir() else {},
    }
    if results["profile"]:
        results["projection"] = project.project(results)
    return results


def _point(results: dict[str, Any], **want: Any) -> dict[str, Any] | None:
    for bench in results["bench"]:
        for p in bench["points"]:
            if all(p.get(k) == v for k, v in want.items()):
                return dict(p)
    return None


def _llama_point(results: dict[str, Any], pid: str) -> dict[str, Any] | None:
    """llama.cpp's figures at a point: role bench's side-by-side, else a run of its own."""
    for bench in results["bench"]:
        for p in bench["llama_cpp"]:
            if p.get("id") == pid:
                return dict(p)
    for bench in results.get("llama_cpp", []):
        for p in bench["points"]:
            if p.get("id") == pid:
                return dict(p)
    return None


ROW_HEAD = ("| date | card | commit | variant | MTP | layers | tok/s/user c1 | out tok/s c4 | c16 | c64 "
            "| TTFT p50 1k c1 ms | TPOT p50 8k / 64k ms | prefill tok/s 8k / 16k | vLLM / llama.cpp c1 / c64 "
            "| step ms c1 / c64 (profile) | projected 8x PRO 6000: tok/s c1 / agg c64 / prefill 8k |")


def row(results: dict[str, Any]) -> str:
    def fig(point: dict[str, Any] | None, key: str, fmt: str = "{:.1f}") -> str:
        v = None if point is None else point["figures"].get(key)
        return "-" if v is None else fmt.format(v)

    c = {n: _point(results, kind="concurrency", input_len=1024, concurrency=n) for n in (1, 4, 16, 64)}
    ctx = {n: _point(results, kind="context", input_len=n) for n in (8192, 65536)}
    pre = {n: _point(results, kind="prefill", input_len=n) for n in (8192, 16384)}

    def ratio(point: dict[str, Any] | None) -> str:
        if point is None:
            return "-"
        theirs = _llama_point(results, point["id"])
        mine_v, theirs_v = point["figures"].get("output_throughput"), (theirs or {}).get("figures", {}).get(
            "output_throughput")
        return f"{mine_v / theirs_v:.2f}" if mine_v and theirs_v else "-"

    prof = results.get("profile", {})

    def step(label: str) -> str:
        return f"{prof[label]['median_cycle_ms']:.2f}" if label in prof else "-"

    proj = "-"
    if "projection" in results:
        goals = next(iter(results["projection"]["models"].values()))["goals"]
        vals = [goals[k]["projected"] for k in project.GOALS]
        proj = " / ".join("-" if v is None else f"{v:.0f}" for v in vals)
    dev = results["device"]
    cells = [
        results["date"], str(dev.get("name", "?")), results["commit"][:10], results["variant"], str(results["mtp"]),
        f"{results['layers']} of {results['real_layers']}",
        fig(c[1], "tokens_per_user"), fig(c[4], "output_throughput"), fig(c[16], "output_throughput"),
        fig(c[64], "output_throughput"), fig(c[1], "p50_ttft_ms", "{:.0f}"),
        f"{fig(ctx[8192], 'p50_tpot_ms', '{:.2f}')} / {fig(ctx[65536], 'p50_tpot_ms', '{:.2f}')}",
        f"{fig(pre[8192], 'prefill_throughput', '{:.0f}')} / {fig(pre[16384], 'prefill_throughput', '{:.0f}')}",
        f"{ratio(c[1])} / {ratio(c[64])}",
        f"{step('decode-c1')} / {step('decode-c64')}",
        proj,
    ]
    return "| " + " | ".join(cells) + " |"
