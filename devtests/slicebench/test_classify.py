"""glm5_tools.slicebench.classify on synthetic traces of vLLM's worker profiler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trace_maker as tm

from glm5_tools.slicebench import classify as cl


def test_every_millisecond_of_a_step_lands_in_one_row(tmp_path: Path):
    table = cl.classify(tm.write_trace(tmp_path / "t.pt.trace.json.gz", steps=4))
    med = table["median_ms"]
    f = tm.forward_sum()
    assert med["indexer"] == pytest.approx(f["_indexer_logits_kernel"] / 1e3)
    assert med["top-k and sort"] == pytest.approx(
        (f["void vllm::persistent::persistent_topk_kernel<float>"] + f["_sort_topk_rows_kernel"]) / 1e3)
    assert med["MLA attention"] == pytest.approx(
        (f["_sparse_mla_kernel"] + f["void vllm::concat_and_cache_mla_kernel"]) / 1e3)
    assert med["routed experts"] == pytest.approx(
        (f["void moe_vec_q4_K<256>"] + f["void vllm::moe_align_block_size_kernel"]) / 1e3)
    assert med["dense linears"] == pytest.approx(
        (f["void mul_mat_vec_q<5, 1>"] + f["void dequantize_block_cuda<8>"]) / 1e3)
    assert med["norms, RoPE, activations"] == pytest.approx(
        (f["void vllm::fused_add_rms_norm_kernel<bf16>"] + f["triton_poi_fused_mul_silu_0"]) / 1e3)
    assert med["other"] == pytest.approx(f["a_kernel_nobody_knows"] / 1e3)
    # by phase, whatever the kernel's name: the head (a GGUF mat-vec like the linears), the sampler
    assert med[cl.PHASE_ROWS["postprocess"]] == pytest.approx(tm.LM_HEAD[1] / 1e3)
    assert med[cl.PHASE_ROWS["sample"]] == pytest.approx(sum(d for _, d in tm.SAMPLER) / 1e3)
    assert med[cl.PHASE_ROWS["preprocess"]] == pytest.approx(sum(d for _, d in tm.PREPROCESS) / 1e3)
    # the GPU waits GAP_US for the host between steps
    assert med[cl.IDLE] == pytest.approx(tm.GAP_US / 1e3)
    assert table["median_busy_ms"] == pytest.approx(tm.busy_us() / 1e3)
    assert table["median_cycle_ms"] == pytest.approx((tm.busy_us() + tm.GAP_US) / 1e3)
    assert sum(v for r, v in med.items()) == pytest.approx(table["median_cycle_ms"])
    assert len(table["steps"]) == 4
    assert table["unmatched"] == {"a_kernel_nobody_knows": pytest.approx(4 * 7.0)}


def test_plain_json_and_the_markdown(tmp_path: Path):
    a = cl.classify(tm.write_trace(tmp_path / "a.json", steps=3))
    md = cl.markdown({"decode-c1": a, "decode-c64": a})
    assert "| ms per step (median) | decode-c1 | decode-c64 |" in md
    assert "| indexer | 0.030 | 0.030 |" in md
    assert "| **step (cycle)** |" in md


def test_kernel_names_by_class():
    assert cl.kernel_class("void moe_q5_K<128, 8>") == "routed experts"
    assert cl.kernel_class("void vllm::moe::grouped_topk_kernel") == "routed experts"  # the router, not DSA
    assert cl.kernel_class("void vllm::cp_gather_indexer_k_quant_cache_kernel") == "indexer"
    assert cl.kernel_class("void mul_mat_q6_K<true>") == "dense linears"
    assert cl.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32") == "dense linears"
    assert cl.kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "all-reduce"
    assert cl.kernel_class("void vllm::rotary_embedding_kernel") == "norms, RoPE, activations"
    assert cl.kernel_class("mystery") == cl.OTHER


def test_a_trace_without_steps_is_refused(tmp_path: Path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                                                  "args": {"correlation": 1}}]}))
    with pytest.raises(ValueError, match="no 'gpu_model_runner: forward'"):
        cl.classify(path)
