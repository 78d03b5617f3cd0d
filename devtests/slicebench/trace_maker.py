"""Synthetic torch profiler traces in the shape vLLM 0.20.2's worker profiler writes them
(as checked on real H100 traces, an excerpt of which is real-decode-c1.trace.json.gz):
one ``execute_context_..._generation_...`` user annotation per step (execute_model; the
sampler runs after it), CUDA runtime calls with correlation ids, GPU kernels carrying the
correlation id of the call that launched them (CUDA-graph kernels: that of the
cudaGraphLaunch), cpu_ops naming the vLLM op that launched an eager kernel."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

# One decode step's forward pass, as a CUDA graph replay: (kernel name, microseconds)
FORWARD = [
    ("_indexer_logits_kernel", 30.0),
    ("void vllm::persistent::persistent_topk_kernel<float>", 20.0),
    ("_sort_topk_rows_kernel", 5.0),
    ("_sparse_mla_kernel", 15.0),
    ("void moe_vec_q4_K<256>", 100.0),
    ("void vllm::moe_align_block_size_kernel", 4.0),
    ("void mul_mat_vec_q<5, 1>", 60.0),
    ("void dequantize_block_cuda<8>", 6.0),
    ("void quantize_q8_1<c10::BFloat16>", 3.0),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", 9.0),
    ("void vllm::fused_add_rms_norm_kernel<bf16>", 8.0),
    ("triton_poi_fused_mul_silu_0", 3.0),
    ("void vllm::concat_and_cache_mla_kernel", 2.0),
    ("a_kernel_nobody_knows", 7.0),
]
LM_HEAD = ("void mul_mat_vec_q<14, 1>", 50.0)
SAMPLER = [("void at::native::reduce_kernel<argmax>", 10.0), ("void at::native::softmax_warp_forward", 4.0)]
PREPROCESS = [("void at::native::elementwise_kernel<copy>", 2.0)]
GAP_US = 40.0  # the host's time between one step's last kernel and the next step's first
GPU_PID = 0


def forward_sum() -> dict[str, float]:
    return {name: dur for name, dur in FORWARD}


def make_trace(steps: int = 4, t0: float = 1000.0) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    corr = 1
    cpu = t0
    gpu = t0 + 50.0

    def kernel(name: str, dur: float, correlation: int) -> None:
        nonlocal gpu
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": GPU_PID, "tid": 7, "ts": gpu, "dur": dur,
                       "args": {"correlation": correlation, "device": 0, "stream": 7}})
        gpu += dur

    def annotate(start: float, dur: float, tokens: int = 1) -> None:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"execute_context_0(0)_generation_1({tokens})",
                       "pid": 1, "tid": 1, "ts": start, "dur": dur, "args": {}})

    def launch(name: str, at: float) -> int:
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": at, "dur": 2.0,
                       "args": {"correlation": corr}})
        return corr

    def op(name: str, at: float, dur: float) -> None:
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": at, "dur": dur,
                       "args": {}})

    for _ in range(steps):
        annotate(cpu, 90.0)
        for name, dur in PREPROCESS:
            kernel(name, dur, launch("cudaLaunchKernel", cpu + 5.0))
        graph = launch("cudaGraphLaunch", cpu + 30.0)
        for name, dur in FORWARD:
            kernel(name, dur, graph)
        op("vllm::_fused_mul_mat_gguf", cpu + 60.0, 10.0)
        kernel(*LM_HEAD, launch("cudaLaunchKernel", cpu + 62.0))
        op("aten::argmax", cpu + 95.0, 10.0)
        for name, dur in SAMPLER:
            kernel(name, dur, launch("cudaLaunchKernel", cpu + 97.0))
        gpu += GAP_US
        cpu += 500.0
    # a step that scheduled nothing: left out
    events.append({"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_0(0)", "pid": 1,
                   "tid": 1, "ts": cpu, "dur": 10.0, "args": {}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: Path, steps: int = 4) -> Path:
    data = json.dumps(make_trace(steps)).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def busy_us() -> float:
    return (sum(d for _, d in FORWARD) + LM_HEAD[1] + sum(d for _, d in SAMPLER) + sum(d for _, d in PREPROCESS))
