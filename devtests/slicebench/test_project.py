"""glm5_tools.slicebench.project: the measured slice step on 8x RTX PRO 6000 (a projection)."""

from __future__ import annotations

import pytest

from glm5_tools.slicebench import classify as cl
from glm5_tools.slicebench import project as pj

LAYERS = 26


def _capture(kind: str, batch: int, tokens: int, ms: dict[str, float]) -> dict:
    rows = list(ms)
    return {"kind": kind, "batch": batch, "tokens_per_step": tokens, "vocab": 154880, "rows": rows,
            "median_ms": ms, "median_cycle_ms": sum(ms.values()), "median_busy_ms": 0.0, "steps": []}


def _results(card: str = "NVIDIA H100 80GB HBM3", copy: float = 3000.0) -> dict:
    return {
        "layers": LAYERS,
        "device": {"name": card, "copy_GBps": copy},
        "profile": {
            "decode-c1": _capture("decode", 1, 1, {"routed experts": 2.6, "dense linears": 1.3,
                                                   cl.LM_HEAD: 0.8, cl.SAMPLER: 0.2,
                                                   cl.IDLE: 0.5}),
            "decode-c64": _capture("decode", 64, 64, {"routed experts": 13.0, "MLA attention": 2.6,
                                                      cl.LM_HEAD: 1.6, cl.IDLE: 0.5}),
            "prefill": _capture("prefill", 1, 8192, {"routed experts": 52.0, "norms, RoPE, activations": 5.2,
                                                     cl.IDLE: 1.0}),
        },
    }


def test_each_row_is_scaled_by_its_kind():
    proj = pj.project(_results())
    mem = 3000.0 / pj.PRO6000_GBPS
    compute = pj.MEASURED_CARD_BF16_TFLOPS["H100"] / pj.PRO6000_BF16_TFLOPS
    nccl = proj["models"][pj.MODELS[0].name]["captures"]
    c1 = nccl["decode-c1"]["rows"]
    assert c1["routed experts"] == pytest.approx(2.6 * 78 / LAYERS * mem)  # per layer, memory-bound
    assert c1[cl.LM_HEAD] == pytest.approx(0.8 / 8 * mem)  # vocab / 8 per rank
    assert c1[cl.SAMPLER] == pytest.approx(0.2 * mem)  # once per step
    assert c1[cl.IDLE] == pytest.approx(0.5)  # CPU time, as measured
    # 2 all-reduces of one token's hidden state per layer at 24 us + its bytes over 25 GB/s
    one = 24.0 + 2 * 7 / 8 * 6144 * 2 / (25.0 * 1e3)
    assert c1["all-reduce x 2 per layer (TP 8)"] == pytest.approx(2 * 78 * one / 1e3)
    assert nccl["decode-c1"]["tok_s_per_user"] == pytest.approx(1e3 / nccl["decode-c1"]["step_ms"])
    assert nccl["decode-c64"]["aggregate_tok_s"] == pytest.approx(64e3 / nccl["decode-c64"]["step_ms"])
    pre = nccl["prefill"]["rows"]
    assert pre["routed experts"] == pytest.approx(52.0 * 78 / LAYERS * compute)  # compute-bound in prefill
    assert pre["norms, RoPE, activations"] == pytest.approx(5.2 * 78 / LAYERS * mem)
    chunk = 24.0 + 2 * 7 / 8 * 8192 * 6144 * 2 / (25.0 * 1e3)
    assert pre["all-reduce x 2 per layer (TP 8)"] == pytest.approx(2 * 78 * chunk / 1e3)
    assert nccl["prefill"]["prefill_tok_s"] == pytest.approx(8192e3 / nccl["prefill"]["step_ms"])


def test_the_second_row_takes_flashinfers_one_shot_latency():
    proj = pj.project(_results())
    nccl, fi = (proj["models"][m.name]["captures"]["decode-c1"] for m in pj.MODELS)
    ar = "all-reduce x 2 per layer (TP 8)"
    assert nccl["rows"][ar] - fi["rows"][ar] == pytest.approx(2 * 78 * (24.0 - 12.0) / 1e3)
    assert fi["tok_s_per_user"] > nccl["tok_s_per_user"]


def test_goals_and_markdown():
    proj = pj.project(_results())
    goals = proj["models"][pj.MODELS[0].name]["goals"]
    assert set(goals) == set(pj.GOALS)
    for g in goals.values():
        assert g["projected"] is not None and g["ratio"] == pytest.approx(g["projected"] / g["goal"])
    md = pj.markdown(proj)
    assert md.startswith("**PROJECTION, not a measurement**")
    assert "| single-stream decode tok/s | 100 |" in md
    assert md.count("| **step** |") == 2


def test_an_h200_scales_by_its_own_bandwidth_and_an_unknown_card_is_refused():
    h100 = pj.project(_results())["models"][pj.MODELS[0].name]["captures"]["decode-c1"]["rows"]["routed experts"]
    h200 = pj.project(_results("NVIDIA H200", 4300.0))["models"][pj.MODELS[0].name]["captures"]["decode-c1"]
    assert h200["rows"]["routed experts"] == pytest.approx(h100 * 4300.0 / 3000.0)
    with pytest.raises(ValueError, match="no published throughput"):
        pj.project(_results("NVIDIA A100-SXM4-80GB"))
