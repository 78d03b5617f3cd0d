"""glm5_tools.slicebench.collect: one run's results.json, tables and the row of the
serving-slice table, from the files the GPU-machine steps leave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trace_maker as tm

from glm5_tools.slicebench.__main__ import main


def _point(pid: str, kind: str, inp: int, conc: int, **fig: float) -> dict:
    return {"id": pid, "profile": kind, "kind": kind, "input_len": inp, "output_len": 128, "concurrency": conc,
            "num_prompts": 2, "figures": fig}


def _run_dir(tmp_path: Path, side_by_side: bool = True) -> Path:
    run = tmp_path / "results" / "vllm-mtp0" / "bench-full+llama" / "slice" / "20261207T050000Z"
    run.mkdir(parents=True)
    points = [_point("sweep-in1024-out128-c1", "concurrency", 1024, 1, tokens_per_user=40.0, output_throughput=39.0,
                     p50_ttft_ms=120.0),
              _point("sweep-in1024-out128-c64", "concurrency", 1024, 64, output_throughput=900.0),
              _point("context-in65536-out128-c1", "context", 65536, 1, p50_tpot_ms=30.5),
              _point("prefill-in8192-out1-c1", "prefill", 8192, 1, prefill_throughput=7000.0)]
    llama = [dict(p, figures={"output_throughput": p["figures"].get("output_throughput", 1.0) / 3}) for p in points]
    (run / "summary.json").write_text(json.dumps({"run": run.name, "points": points,
                                                  "llama_cpp": llama if side_by_side else [],
                                                  "server": {}, "skipped": []}))
    if not side_by_side:  # llama.cpp as a bench.yml run of its own (tools/gpu/run llama:full)
        own = tmp_path / "results" / "vllm-mtp0" / "llama-full" / "slice" / "20261207T051000Z"
        own.mkdir(parents=True)
        (own / "summary.json").write_text(json.dumps({"run": own.name, "points": llama, "llama_cpp": []}))
    return run


@pytest.mark.parametrize("side_by_side", [True, False])
def test_collect_writes_results_tables_and_the_row(tmp_path: Path, capsys, side_by_side: bool):
    run = _run_dir(tmp_path, side_by_side)
    llama = [] if side_by_side else ["--llama-dir", str(next((tmp_path / "results").glob("*/llama-full/slice/*")))]
    manifest = tmp_path / "slice.json"
    manifest.write_text(json.dumps({"layers": 26, "real_layers": 78, "file_bytes": 20_000_000_000,
                                    "recipe": {"config": {"vocab_size": 154880}}}))
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"name": "NVIDIA H100 80GB HBM3", "copy_GBps": 3000.0}))
    prof = tmp_path / "prof"
    for label, kind, batch, tokens in (("decode-c1", "decode", 1, 1), ("decode-c64", "decode", 64, 64),
                                       ("prefill", "prefill", 1, 8192)):
        tm.write_trace(prof / label / "trace.json.gz", steps=3)
        (prof / label / "meta.json").write_text(json.dumps({"label": label, "kind": kind, "batch": batch,
                                                            "tokens_per_step": tokens}))
    out = tmp_path / "out"
    assert main(["collect", "--slice-manifest", str(manifest), "--machine", str(machine), "--bench-dir", str(run),
                 *llama, "--profile-dir", str(prof), "--variant", "triton", "--commit", "abcdef1234567", "--date",
                 "2026-12-07", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["profile"]) == {"decode-c1", "decode-c64", "prefill"}
    assert results["projection"]["projection"] is True
    row = (out / "row.md").read_text().splitlines()[1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:6] == ["2026-12-07", "NVIDIA H100 80GB HBM3", "abcdef1234", "triton", "0", "26 of 78"]
    assert cells[6] == "40.0" and cells[9] == "900.0" and cells[10] == "120"
    assert cells[11] == "- / 30.50" and cells[12] == "7000 / -"
    assert cells[13] == "3.00 / 3.00"  # vLLM / llama.cpp output throughput
    step = (tm.busy_us() + tm.GAP_US) / 1e3
    assert cells[14] == f"{step:.2f} / {step:.2f}"
    assert len(cells[15].split(" / ")) == 3
    assert "PROJECTION" in (out / "projection.md").read_text()
    assert "| indexer |" in (out / "profile.md").read_text()
    assert "abcdef1234" in capsys.readouterr().out


def test_project_and_classify_from_the_command_line(tmp_path: Path, capsys):
    trace = tm.write_trace(tmp_path / "decode-c1" / "trace.json.gz")
    assert main(["classify", str(trace), "--json", str(tmp_path / "t.json")]) == 0
    assert "| MLA attention |" in capsys.readouterr().out
    table = json.loads((tmp_path / "t.json").read_text())
    results = {"layers": 20, "device": {"name": "NVIDIA H200", "copy_GBps": 4300.0},
               "profile": {"decode-c1": {**next(iter(table.values())), "kind": "decode", "batch": 1,
                                         "tokens_per_step": 1}}}
    (tmp_path / "r.json").write_text(json.dumps(results))
    assert main(["project", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "p.md")]) == 0
    assert "not captured" in (tmp_path / "p.md").read_text()  # no c64 or prefill capture in this run
