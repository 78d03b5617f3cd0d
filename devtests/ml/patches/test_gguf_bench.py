"""tools/gpu/gguf_bench.py, the GPU harness of the GGUF kernels: what runs without a GPU.

The timing and the GPU exactness check need the device (docs/validation/gguf-kernels.md);
here: the kernels module is extracted from patch 0015 as the device call does, every
candidate configuration is one the kernels take (traced, not run, on the CPU: each
launches with the real per-rank shapes), and the summary's tables and corrections.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import overlay

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "tools" / "gpu" / "gguf_bench.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gguf_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gguf_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_extract_gives_the_patched_module(tmp_path: Path) -> None:
    import conftest

    gb = bench()
    patch = overlay.PATCH_DIR / "0015-gguf-triton-kernels.patch"
    files = gb.extract_new_files(patch, tmp_path)
    rel = "vllm/model_executor/layers/quantization/gguf_triton.py"
    assert files == [tmp_path / rel]
    assert files[0].read_text(encoding="utf-8") == (conftest.PATCHED_SITE / rel).read_text(encoding="utf-8")


def test_every_candidate_launches_at_the_real_shapes() -> None:
    """Each candidate of each step size goes through gguf_linear / gguf_moe with the
    per-rank shapes (launches recorded by sm_check's recorder, not run)."""
    import torch
    from vllm.model_executor.layers.quantization import gguf_triton as gt

    from glm5_tools.sm_check.trace import Recorder, recording

    gb = bench()
    d = gb.Dims(tp=8)
    rec = Recorder()
    w13 = torch.empty((d.experts, 2 * d.inter, d.hidden // 256 * 144), dtype=torch.uint8)
    w2 = torch.empty((d.experts, d.hidden, d.inter // 256 * 176), dtype=torch.uint8)
    seen: set[str] = set()
    with recording(rec):
        for t in gb.MOE_TOKENS:
            cands = gb.moe_candidates(gt, t)
            assert cands, t
            assert all(c.form in ("dot", "dotq") for c in cands) or t <= 16
            assert {c.form for c in cands} >= {"dot", "dotq"} or t < 4
            x = torch.empty((t, d.hidden), dtype=torch.float16)
            ids = torch.stack([torch.randperm(d.experts)[: d.topk] for _ in range(t)]).to(torch.int32)
            for cfg in cands:
                gt.gguf_moe(x, w13, w2, torch.rand(t, d.topk), ids, gt.Q4_K, gt.Q5_K, config=cfg)
                seen.add(gb.cfg_name(cfg))
        for _name, k, n, qt in [*d.dense_ops(), d.lm_head()]:
            if qt is None:
                continue
            w = torch.empty((n, k // 256 * gt.BLOCK[qt][1]), dtype=torch.uint8)
            for t in gb.DENSE_TOKENS[:4]:
                for cfg in gb.dense_candidates(gt, t):
                    gt.gguf_linear(torch.empty((t, k), dtype=torch.float16), w, qt, config=cfg)
    kernels = {r.name for r in rec.launches}
    assert kernels == {
        "_moe_gate_up_fma_kernel", "_moe_down_fma_kernel", "_moe_gate_up_dot_kernel", "_moe_down_dot_kernel",
        "_dense_fma_kernel", "_dense_dot_kernel",
    }
    assert len(seen) == len({gb.cfg_name(c) for t in gb.MOE_TOKENS for c in gb.moe_candidates(gt, t)})


def test_summary_tables_and_the_first_runs_floor() -> None:
    gb = bench()
    base = {"label": "r", "device": "GPU", "sms": 132, "date": "d", "torch": "t", "triton": "x", "command": "c"}
    row = {"tokens": 1, "unique_experts": 8, "vllm": 58.0, "vllm_best": 58.0, "marlin": 35.0, "triton": 14.0,
           "triton_config": "fma256_n64_s4_u4_w4", "floor": 7.0}
    dense = [
        {"tokens": 1, "op": "q_a", "vllm": 12.0, "cublas": 15.0, "triton": 6.0, "best": 6.0, "floor": 3.0},
        {"tokens": 1, "op": "router", "vllm": 2.0, "cublas": 2.0, "triton": 2.0, "best": 2.0, "floor": 1.0},
        {"tokens": 16, "op": "q_a", "vllm": 60.0, "cublas": 14.0, "triton": 20.0, "best": 20.0, "floor": 3.0},
    ]
    new = dict(base, read_bw_GBps=3000.0, read_bw_is="copy", moe=[dict(row)], dense=[dict(r) for r in dense])
    text = gb.summarize([new])
    assert "| 1 | 8.0 | 58.0 | 58.0 | 35.0 | 14.0 | fma256_n64_s4_u4_w4 | 0.40 | 2.00 |" in text
    # a step size with a layer op missing (16: no router row) is no layer total
    assert "| 1 | 14.0 | 17.0 | 8.0 | 8.0 | 4.0 | 0.47 |" in text
    assert "\n| 16 |" not in text.split("Non-expert linears")[1]
    # run 1 measured the bandwidth as bytes read only: its floors are halved, its figure doubled
    old = dict(base, read_bw_GBps=1500.0, moe=[dict(row)], dense=[dict(r) for r in dense])
    text = gb.summarize([old])
    assert "copy bandwidth 3,000 GB/s" in text
    assert "| 14.0 | fma256_n64_s4_u4_w4 | 0.40 | 4.00 |" in text


def test_checks_group_by_layer_and_form() -> None:
    gb = bench()
    rows = [
        {"what": "q_a fma256_n16_s8_u4_w4", "tokens": 1, "triton_err": 3e-4, "vllm_err": 3e-3, "bound": 1e-3},
        {"what": "q_a fma256_n32_s4_u4_w4", "tokens": 3, "triton_err": 4e-4, "vllm_err": 5e-3, "bound": 1e-3},
        {"what": "q_a dot_m16_n32_u2_w4_st2", "tokens": 16, "triton_err": 5e-4, "vllm_err": 5e-3, "bound": 2e-3},
    ]
    groups = gb._group_checks(rows)
    assert set(groups) == {("q_a", "fma256"), ("q_a", "dot")}
    assert len(groups[("q_a", "fma256")]) == 2


def test_dispatch_follows_the_latest_kernel_run() -> None:
    """gguf.py's triton ranges and gguf_triton's tables against the kernel bench's
    latest GPU run (docs/validation/gguf-kernels/run3.json, H100): inside a range the
    table's configuration is the sweep's fastest (within 10%) and faster than tuned's
    choice at that size; outside, the fastest Triton configuration is not faster than
    tuned's (dense layers: summed over the layers of a type, which share one range)."""
    import json

    from vllm.model_executor.layers.quantization import gguf as g
    from vllm.model_executor.layers.quantization import gguf_triton as gt

    gb = bench()
    run = json.loads((ROOT / "docs" / "validation" / "gguf-kernels" / "run3.json").read_text(encoding="utf-8"))
    for row in run["moe"]:
        t, cfgs = row["tokens"], row["triton_configs"]
        if any(lo <= t <= hi for lo, hi in g.TRITON_MOE_TOKENS):
            table = cfgs[gb.cfg_name(gt.moe_config(t))]
            assert table <= 1.1 * row["triton"] and table < row["vllm_best"], (t, table, row["triton"])
        else:
            assert row["triton"] >= row["vllm_best"], (t, row["triton"], row["vllm_best"])

    def tuned(row: dict[str, float]) -> float:
        return min(row[k] for k in ("vllm_mmvq", "vllm_mmq", "vllm_dequant") if row.get(k))

    sums: dict[tuple[str, int], list[float]] = {}  # (the head or a type, tokens) -> [Triton, tuned]
    inside: dict[tuple[str, int], bool] = {}
    for row in run["dense"]:
        if row["type"] is None:
            continue
        t = row["tokens"]
        key = (row["op"] if row["op"] == "lm_head" else f"type {row['type']}", t)
        lo, hi = g.triton_dense_tokens(row["type"], row["n"])  # the head's rows select its own range
        inside[key] = lo <= t <= hi
        triton = row["triton_configs"][gb.cfg_name(gt.dense_config(t))] if inside[key] else row["triton"]
        if inside[key]:
            assert triton <= 1.1 * row["triton"], (row["op"], t, triton, row["triton"])
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += triton
        acc[1] += tuned(row)
    for key, (triton, vllm) in sums.items():
        assert (triton < vllm) == inside[key], (*key, triton, vllm)
