"""glm5_tools.slicebench.classify on an excerpt of a real vLLM 0.20.2 trace and on
synthetic traces of the same shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trace_maker as tm

from glm5_tools.slicebench import classify as cl

# 4 decode steps at concurrency 1 of the 24-layer slice, variant vllm, H100 (torch
# profiler trace of vLLM 0.20.2, trimmed to the fields the classifier reads; steps 3-6 of
# the capture, timestamps from the first step's annotation)
REAL = Path(__file__).parent / "real-decode-c1.trace.json.gz"


def test_a_real_decode_trace_by_class():
    table = cl.classify(REAL)
    steps = table["steps"]
    assert [s["tokens"] for s in steps] == [1, 1, 1, 1]
    assert all(s["graphs"] == 1 for s in steps) and table["cuda_graphs"]
    assert table["unmatched"] == {} and table["kernels_outside_steps"] == 0
    # the second step, checked by hand from the events: the LM head is what runs after the
    # cudaGraphLaunch inside the annotation (the hidden state gather: 1.664 + 3.552 us, the
    # q8_1 quantize 1.408, the q6_K mat-vec over the vocabulary 454.762), the sampler what
    # runs after the annotation (argmax 8.993, copies, a memset and the DtoH copy: 18.016)
    s1 = steps[1]["ms"]
    assert s1[cl.LM_HEAD] == pytest.approx(0.461386, abs=1e-6)
    assert s1[cl.SAMPLER] == pytest.approx(0.018016, abs=1e-6)
    # the graph's 1,308 kernels (6.052 ms) by class
    forward = [c for c, _ in cl.CLASSES] + [cl.OTHER, cl.MEMCPY]
    assert sum(v for r, v in s1.items() if r in forward) == pytest.approx(6.052446, abs=1e-5)
    assert s1["dense linears"] == pytest.approx(2.1632, abs=1e-4)
    assert s1["routed experts"] == pytest.approx(0.9798, abs=1e-4)
    assert s1[cl.QUANT] == pytest.approx(0.3258, abs=1e-4)
    assert s1["indexer"] == pytest.approx(0.2181, abs=1e-4)
    assert s1["MLA attention"] == pytest.approx(0.2686, abs=1e-4)
    # from its first kernel to the next step's first kernel; the GPU is busy 5.161 ms of it
    assert steps[1]["cycle_ms"] == pytest.approx(6.938781, abs=1e-5)
    assert steps[1]["busy_ms"] == pytest.approx(5.1606, abs=1e-4)
    assert s1[cl.IDLE] == pytest.approx(6.938781 - steps[1]["busy_ms"], abs=1e-6)
    # the shared expert's q6_K mat-vecs (and their quantize, SiLU) run on a second stream
    assert steps[1]["side_stream_ms"] == pytest.approx(1.5, abs=0.05)
    # the median leaves out the last step (no next step to end its cycle): steps 0-2
    assert table["median_cycle_ms"] == pytest.approx(7.546, abs=1e-3)
    assert table["median_ms"]["dense linears"] == pytest.approx(2.1632, abs=1e-4)
    assert table["median_ms"][cl.LM_HEAD] == pytest.approx(0.4616, abs=1e-4)


def test_every_millisecond_of_a_synthetic_step_lands_in_one_row(tmp_path: Path):
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
    assert med[cl.QUANT] == pytest.approx(f["void quantize_q8_1<c10::BFloat16>"] / 1e3)
    assert med[cl.DENSE_BF16] == pytest.approx(f["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"] / 1e3)
    assert med["norms, RoPE, activations"] == pytest.approx(
        (f["void vllm::fused_add_rms_norm_kernel<bf16>"] + f["triton_poi_fused_mul_silu_0"]) / 1e3)
    assert med["other"] == pytest.approx(f["a_kernel_nobody_knows"] / 1e3)
    # by where it was launched, whatever the kernel's name: the head (a GGUF mat-vec like
    # the linears) after the graph, the sampler after the step's annotation
    assert med[cl.LM_HEAD] == pytest.approx(tm.LM_HEAD[1] / 1e3)
    assert med[cl.SAMPLER] == pytest.approx(sum(d for _, d in tm.SAMPLER) / 1e3)
    assert med[cl.INPUT] == pytest.approx(sum(d for _, d in tm.PREPROCESS) / 1e3)
    # the GPU waits GAP_US for the host between steps
    assert med[cl.IDLE] == pytest.approx(tm.GAP_US / 1e3)
    assert table["median_busy_ms"] == pytest.approx(tm.busy_us() / 1e3)
    assert table["median_cycle_ms"] == pytest.approx((tm.busy_us() + tm.GAP_US) / 1e3)
    assert sum(v for r, v in med.items()) == pytest.approx(table["median_cycle_ms"])
    assert len(table["steps"]) == 4 and table["empty_steps"] == 1
    assert table["unmatched"] == {"a_kernel_nobody_knows": pytest.approx(4 * 7.0)}


def _x(cat: str, name: str, ts: float, dur: float, corr: int | None = None, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur,
            "args": {} if corr is None else {"correlation": corr}}


def test_an_eager_forward_places_generic_kernels_by_the_op_that_launched_them():
    # a prefill chunk: no CUDA graph, torch.compile's regions and vLLM's ops on the host
    ev = [_x("user_annotation", "execute_context_1(7168)_generation_0(0)", 0.0, 1000.0),
          _x("cpu_op", "## Call CompiledFxGraph abc ##", 100.0, 50.0),
          _x("cpu_op", "triton_red_fused__to_copy_add_mean_moe_forward_shared_mul_pow_rsqrt_0", 110.0, 5.0),
          _x("cuda_runtime", "cuLaunchKernel", 111.0, 2.0, 1),
          _x("cpu_op", "vllm::_fused_moe_gguf", 200.0, 100.0),
          _x("cpu_op", "_C::ggml_moe_a8", 210.0, 20.0),
          _x("cuda_runtime", "cudaLaunchKernel", 211.0, 2.0, 2),  # quantize_q8_1 for the experts
          _x("cuda_runtime", "cudaLaunchKernel", 215.0, 2.0, 3),  # moe_q5_K
          _x("cpu_op", "aten::mul_", 240.0, 10.0),
          _x("cuda_runtime", "cudaLaunchKernel", 241.0, 2.0, 4),  # the routing weights' multiply
          _x("cpu_op", "vllm::_fused_mul_mat_gguf", 400.0, 50.0),
          _x("cpu_op", "_C::ggml_dequantize", 405.0, 5.0),
          _x("cuda_runtime", "cudaLaunchKernel", 406.0, 2.0, 5),  # a dequantize for a dense GEMM
          _x("cpu_op", "aten::mm", 420.0, 5.0),
          _x("cuda_runtime", "cudaLaunchKernel", 421.0, 2.0, 6),  # its bf16 GEMM
          _x("cpu_op", "## Call CompiledFxGraph def ##", 500.0, 50.0),
          _x("cpu_op", "vllm::_fused_mul_mat_gguf", 800.0, 50.0),  # the LM head, after the forward
          _x("cuda_runtime", "cudaLaunchKernel", 801.0, 2.0, 7)]
    for corr, name, dur in ((1, "triton_red_fused__to_copy_add_mean_moe_forward_shared_mul_pow_rsqrt_0", 1.0),
                            (2, "void quantize_q8_1<c10::BFloat16>", 2.0), (3, "void moe_q5_K<bf16, false>", 40.0),
                            (4, "void at::native::elementwise_kernel<128, 4>", 8.0),
                            (5, "void dequantize_block<bf16>", 4.0), (6, "nvjet_sm90_tst_256x128_64x4_1x2_h", 16.0),
                            (7, "void mul_mat_vec_q<q6_K>", 32.0)):
        ev.append(_x("kernel", name, 2000.0 + 100 * corr, dur, corr, tid=7))
    table = cl.classify_events(ev)
    med = table["median_ms"]
    assert med["routed experts"] == pytest.approx((2.0 + 40.0 + 8.0) / 1e3)
    assert med["dense linears"] == pytest.approx((4.0 + 16.0) / 1e3)
    assert med[cl.DENSE_BF16] == 0.0 and med[cl.QUANT] == 0.0
    assert med["norms, RoPE, activations"] == pytest.approx(1.0 / 1e3)
    assert med[cl.LM_HEAD] == pytest.approx(32.0 / 1e3)
    assert table["median_tokens"] == 7168 and table["cuda_graphs"] is False


def test_plain_json_and_the_markdown(tmp_path: Path):
    a = cl.classify(tm.write_trace(tmp_path / "a.json", steps=3))
    md = cl.markdown({"decode-c1": a, "decode-c64": a})
    assert "| ms per step (median) | decode-c1 | decode-c64 |" in md
    assert "| indexer | 0.030 | 0.030 |" in md
    assert "| **step (cycle)** |" in md
    assert "| forward as CUDA graph | yes | yes |" in md


def test_kernel_names_by_class():
    assert cl.kernel_class("void moe_q5_K<128, 8>") == "routed experts"
    assert cl.kernel_class("_moe_gate_up_fma_kernel") == "routed experts"
    assert cl.kernel_class("_dense_fma_kernel") == "dense linears"
    assert cl.kernel_class("void vllm::moe::grouped_topk_kernel") == "routed experts"  # the router, not DSA
    assert cl.kernel_class("void vllm::cp_gather_indexer_k_quant_cache_kernel") == "indexer"
    assert cl.kernel_class("_rank_topk_rows_kernel") == "top-k and sort"
    assert cl.kernel_class("_convert_req_index_to_global_index_kernel") == "MLA attention"
    assert cl.kernel_class("void mul_mat_q6_K<true>") == "dense linears"
    assert cl.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32") == cl.DENSE_BF16
    assert cl.kernel_class("triton_red_fused__to_copy_add_mean_moe_forward_shared_mul_pow_rsqrt_0") \
        == "norms, RoPE, activations"  # torch.compile's fused RMS norm, whatever ops its name quotes
    assert cl.kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "all-reduce"
    assert cl.kernel_class("void vllm::rotary_embedding_kernel") == "norms, RoPE, activations"
    assert cl.kernel_class("mystery") == cl.OTHER


def test_a_trace_without_steps_is_refused(tmp_path: Path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                                                  "args": {"correlation": 1}}]}))
    with pytest.raises(ValueError, match="no 'execute_context_"):
        cl.classify(path)
