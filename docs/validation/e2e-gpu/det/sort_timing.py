"""Issue 23, determinism of the sparse path: what sorting persistent_topk's selection costs
on the GPU, and whether it makes the sparse MLA output repeatable. Run on the device
machine (CUDA GPU, torch + triton; vLLM optional).

usage: [PYTHONPATH=<patched vLLM site>] python3 docs/validation/e2e-gpu/det/sort_timing.py [--out DIR]

The kernels: 0011's sparse_utils (sort_topk_rows, sparse_mla) from the patched vLLM on
PYTHONPATH when it has them, else the added lines of 0011's sparse_utils.py taken from
files/patches/vllm-0.20.2 of this checkout (the same code; vLLM not needed).
torch.ops._C.persistent_topk comes from vLLM's _C when it imports (a vLLM site on
PYTHONPATH); without it the selection check uses torch.topk's set in random orders.

1. Timing, CUDA graph of one op, median of 7 x 200 replays (as run 6 timed torch.sort):
   0011's sort kernels (bitonic at num_warps 4/8/16, rank at 4/8, and the default choice
   as indexer_topk calls it) against torch.sort (-1 kept last, as run 6) of int32
   [rows, 2048], rows 1/16/64/256 (decode batches) and 4096 (a prefill chunk); the floor
   (a graph of one tiny op); with _C also persistent_topk alone and + the sort (64k).
2. Correctness: both kernels, in place and into a wider buffer, equal torch.sort (-1
   last) on random rows with padding and duplicates.
3. Repeatability: 5 selections of the same scores (persistent_topk, or torch.topk's set
   shuffled), each through sparse_mla (GLM-5's per-rank dims at TP 8: 8 heads, 512 + 64)
   with and without the sort: max |difference| against the first call.
Writes sort_timing.json and sort_timing.txt to --out (default $OUT, else .).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
PATCH = REPO / "files/patches/vllm-0.20.2/0011-glm-dsa-sparse-mla-triton.patch"
TARGET = "+++ b/vllm/v1/attention/backends/mla/sparse_utils.py"
START = "# --- glm5 patch set, 0011"
HEADER = (
    "import math\nimport os\nfrom dataclasses import dataclass\n\nimport torch\n"
    "import triton\nimport triton.language as tl\n\n"
)
INT32_MAX = 2**31 - 1


def module_from_patch(patch: Path, where: Path) -> ModuleType:
    """0011's added sparse_utils code (from its '# --- glm5 patch set, 0011' line to the
    end of the file's diff) as a module of its own."""
    lines = patch.read_text(encoding="utf-8").split("\n")
    i = lines.index(TARGET)
    body: list[str] = []
    started = False
    for line in lines[i + 1 :]:
        if line.startswith(("--- a/", "diff ")):
            break
        if not started:
            started = line.startswith("+" + START)
        if started and line.startswith("+"):
            body.append(line[1:])
    if not body:
        raise SystemExit(f"no '{START}' block in {patch}")
    path = where / "glm5_sparse_utils_0011.py"
    path.write_text(HEADER + "\n".join(body) + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("glm5_sparse_utils_0011", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_kernels(tmp: Path) -> tuple[ModuleType, str]:
    try:
        from vllm.v1.attention.backends.mla import sparse_utils as su

        if hasattr(su, "sort_topk_rows"):
            return su, f"vllm site {Path(su.__file__).parents[5]}"
    except Exception as e:
        print("vLLM sparse_utils not usable:", type(e).__name__, str(e)[:200])
    return module_from_patch(PATCH, tmp), f"extracted from {PATCH.relative_to(REPO)}"


def persistent_topk() -> Callable[..., Any] | None:
    try:
        import vllm._C  # noqa: F401  (registers torch.ops._C)

        return torch.ops._C.persistent_topk
    except Exception as e:
        print("persistent_topk not available:", type(e).__name__, str(e)[:200])
        return None


def graph_us(fn: Callable[[], Any], reps: int = 7, replays: int = 200) -> float:
    """Median over reps of the mean time of one replay of a CUDA graph holding fn()."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / replays)
    return sorted(times)[len(times) // 2]


def torch_sort_last(x: torch.Tensor) -> torch.Tensor:
    """torch.sort of each row, -1 (any negative) kept last (run 6's measurement)."""
    y = torch.sort(torch.where(x < 0, INT32_MAX, x), dim=1).values
    return torch.where(y == INT32_MAX, -1, y)


def selection(rows: int, k: int, width: int, gen: torch.Generator, dev: str) -> torch.Tensor:
    """Distinct positions < width per row in random order; rows past half have -1 padding."""
    out = torch.stack([torch.randperm(width, generator=gen, device=dev)[:k] for _ in range(rows)]).int()
    for r in range(rows // 2, rows):
        out[r, k - 1 - r % k :] = -1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="checks 2 and 3 only, small shapes, on the CPU (run with TRITON_INTERPRET=1): tests this script",
    )
    args = ap.parse_args()
    smoke = args.cpu_smoke
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = "cpu" if smoke else "cuda"
    tmp = Path(tempfile.mkdtemp(prefix="det-"))
    su, source = load_kernels(tmp)
    ptopk = None if smoke else persistent_topk()
    gpu = "cpu (Triton interpreter)" if smoke else torch.cuda.get_device_properties(0).name
    import triton

    res: dict[str, Any] = {
        "gpu": gpu,
        "capability": [] if smoke else list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernels": source,
        "persistent_topk": ptopk is not None,
        "sort_default_on": bool(getattr(su, "SORT_TOPK", None)),
    }
    gen = torch.Generator(device=dev).manual_seed(0)
    k = 256 if smoke else 2048
    lines = [f"{gpu} sm{res['capability']} torch {torch.__version__} triton {triton.__version__}; kernels: {source}"]

    # 2. correctness of the sort on the GPU
    ok = True
    cases = [(3, 256, 700), (3, 37, 50)]
    if not smoke:
        cases = [(64, 2048, 70000), (7, 2048, 3000), (5, 1000, 1200), *cases]
    for rows, kk, width in cases:
        x = selection(rows, kk, width, gen, dev)
        x[0, :5] = x[0, 5]  # duplicates
        want = torch_sort_last(x)
        for method in ("rank", "bitonic", None):
            y = x.clone()
            su.sort_topk_rows(y, width=width, method=method)  # in place
            ok &= bool(torch.equal(y, want))
            z = torch.full((rows, kk + 3), 7, dtype=torch.int32, device=dev)
            su.sort_topk_rows(x, z[:, :kk], width, method=method)  # into a wider buffer
            ok &= bool(torch.equal(z[:, :kk], want)) and bool((z[:, kk:] == 7).all())
    res["sort_equals_torch_sort"] = ok
    lines.append(f"Triton sort == torch.sort (-1 last), padding and duplicates: {ok}")

    # 1. timing
    timing: list[dict[str, Any]] = []
    rank_rows = getattr(su, "SORT_RANK_MAX_ROWS", None)
    res["sort_rank_max_rows"] = rank_rows
    floor_buf = torch.zeros(1, device=dev)
    for rows in () if smoke else (1, 16, 64, 256, 4096):
        x = selection(rows, k, 65536, gen, dev)
        row: dict[str, Any] = {"rows": rows, "k": k}
        row["torch_sort_last_us"] = graph_us(lambda x=x: torch_sort_last(x))
        row["torch_sort_only_us"] = graph_us(lambda x=x: torch.sort(x, dim=1))
        y = x.clone()
        for w in (4, 8, 16):
            row[f"bitonic_w{w}_us"] = graph_us(lambda y=y, w=w: su.sort_topk_rows(y, method="bitonic", num_warps=w))
        for w in (4, 8) if rows <= 256 else ():  # (rank's work grows with the rows)
            row[f"rank_w{w}_us"] = graph_us(
                lambda x=x, y=y, w=w: su.sort_topk_rows(x, y, 65536, method="rank", num_warps=w)
            )
        # as indexer_topk calls it: persistent_topk's scratch buffer into the selection
        row["triton_sort_default_us"] = graph_us(lambda x=x, y=y: su.sort_topk_rows(x, y, 65536))
        row["torch_over_triton_default"] = row["torch_sort_last_us"] / row["triton_sort_default_us"]
        timing.append(row)
    res["graph_floor_us"] = 0.0 if smoke else graph_us(lambda: floor_buf.add_(1))
    res["timing"] = timing
    res["timing_note"] = (
        "CUDA graph of one op, median of 7 x 200 replays, us per replay; bitonic in place, rank from "
        "the input into a second buffer (both the same work for any input); default: src -> dst, "
        f"rank up to {rank_rows} rows, bitonic beyond"
    )
    lines.append(f"graph floor (one tiny op): {res['graph_floor_us']:.1f} us")
    lines.append(
        "rows | torch.sort -1 last | torch.sort alone | bitonic w4 / w8 / w16 | rank w4 / w8 | default | torch/default"
    )
    for r in timing:
        lines.append(
            f"{r['rows']:4d} | {r['torch_sort_last_us']:.1f} | {r['torch_sort_only_us']:.1f} | "
            f"{r['bitonic_w4_us']:.1f} / {r['bitonic_w8_us']:.1f} / {r['bitonic_w16_us']:.1f} | "
            f"{r.get('rank_w4_us', float('nan')):.1f} / {r.get('rank_w8_us', float('nan')):.1f} | "
            f"{r['triton_sort_default_us']:.1f} | {r['torch_over_triton_default']:.1f}x"
        )

    # persistent_topk alone and followed by the sort (decode rows, 64k context)
    if ptopk is not None:
        pt: list[dict[str, Any]] = []
        ws = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
        for rows in (1, 16, 64):
            width = 65536
            scores = torch.randn(rows, width, generator=gen, device=dev)
            ctx = torch.full((rows,), width - 100, dtype=torch.int32, device=dev)
            dst = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
            sel = torch.full((rows, k), -1, dtype=torch.int32, device=dev)

            def top(dst: torch.Tensor = dst, scores: torch.Tensor = scores, ctx: torch.Tensor = ctx) -> None:
                ptopk(scores, ctx, dst, ws, k, scores.shape[1])

            def top_sort(dst: torch.Tensor = dst, sel: torch.Tensor = sel, top: Callable[[], None] = top) -> None:
                top()
                su.sort_topk_rows(dst, sel, 65536)

            a, b = graph_us(top), graph_us(top_sort)
            pt.append({"rows": rows, "width": width, "persistent_topk_us": a, "plus_sort_us": b, "added_us": b - a})
            lines.append(f"persistent_topk {rows} x 64k: {a:.1f} us, + sort {b:.1f} us (+{b - a:.1f})")
        res["persistent_topk_timing"] = pt

    # 3. repeatability of the sparse MLA output
    heads, lora, rope = 8, 512, 64
    rep: list[dict[str, Any]] = []
    for rows in (1, 3) if smoke else (1, 16, 256):
        ctx_max = 600 if smoke else 9000
        ctx = torch.randint(k // 2, ctx_max, (rows,), generator=gen, device=dev, dtype=torch.int32)
        ctx[0] = k * 3 // 4  # a row shorter than k: -1 padding
        scores = torch.randn(rows, ctx_max, generator=gen, device=dev)
        q = torch.randn(rows, heads, lora + rope, generator=gen, device=dev).bfloat16()
        kv = torch.randn(rows * ctx_max, 1, lora + rope, generator=gen, device=dev).bfloat16()
        base = (torch.arange(rows, device=dev, dtype=torch.int32) * ctx_max)[:, None]
        sources = {}
        if ptopk is not None:
            ws = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)

            def sel_ptopk(ws: torch.Tensor = ws, scores: torch.Tensor = scores, ctx: torch.Tensor = ctx) -> Any:
                o = torch.full((scores.shape[0], k), -1, dtype=torch.int32, device=dev)
                ptopk(scores, ctx, o, ws, k, scores.shape[1])
                return o

            sources["persistent_topk"] = sel_ptopk
        masked = scores.masked_fill(torch.arange(ctx_max, device=dev)[None, :] >= ctx[:, None], float("-inf"))
        top = torch.topk(masked, k, dim=1).indices.int()
        top = torch.where(torch.gather(masked, 1, top.long()).isfinite(), top, -1)

        def sel_shuffled(top: torch.Tensor = top) -> torch.Tensor:
            perm = torch.argsort(torch.rand(top.shape, generator=gen, device=dev), dim=1)
            return torch.gather(top, 1, perm)

        sources["torch.topk shuffled"] = sel_shuffled
        for name, make in sources.items():
            entry: dict[str, Any] = {"rows": rows, "selection": name}
            sels = [make() for _ in range(5)]
            entry["set_equal_across_calls"] = all(
                torch.equal(torch_sort_last(s), torch_sort_last(sels[0])) for s in sels
            )
            entry["order_changed_calls"] = sum(int(not torch.equal(s, sels[0])) for s in sels[1:])
            for sort in (False, True):
                outs = []
                for s in sels:
                    s = s.clone()
                    if sort:
                        su.sort_topk_rows(s, width=ctx_max)
                    slots = torch.where(s >= 0, s + base, -1)
                    o, lse = su.sparse_mla(q, kv, slots, 0.1, lora)
                    outs.append((o.float(), lse))
                diff = max(float((o - outs[0][0]).abs().max()) for o, _ in outs)
                dl = max(float((lse - outs[0][1]).nan_to_num(0.0).abs().max()) for _, lse in outs)
                entry["sorted" if sort else "unsorted"] = {
                    "max_abs_out_diff": diff,
                    "max_abs_lse_diff": dl,
                    "bitwise_identical": all(
                        torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1]) for o, lse in outs
                    ),
                }
            rep.append(entry)
            lines.append(
                f"repeat {name} rows {rows}: order changed in {entry['order_changed_calls']}/4, set equal "
                f"{entry['set_equal_across_calls']}; unsorted max|d out| {entry['unsorted']['max_abs_out_diff']:.3g}"
                f" -> sorted {entry['sorted']['max_abs_out_diff']:.3g}"
                f" (identical {entry['sorted']['bitwise_identical']})"
            )
    res["repeatability"] = rep
    res["all_sorted_identical"] = all(e["sorted"]["bitwise_identical"] for e in rep)
    res["wall_s"] = round(time.time() - t0, 1)
    lines.append(f"all sorted outputs bitwise identical: {res['all_sorted_identical']}; wall {res['wall_s']} s")
    (out_dir / "sort_timing.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    (out_dir / "sort_timing.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
