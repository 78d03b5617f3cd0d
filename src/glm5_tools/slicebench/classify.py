"""Where each millisecond of a served step goes: a torch profiler trace, by class of work.

Reads the Chrome-format trace that vLLM 0.20.2's torch profiler writes
(``--profiler-config '{"profiler": "torch", ...}'``, one ``*.pt.trace.json.gz`` per
worker). What such a trace holds (checked on real H100 captures):

- one ``user_annotation`` per engine step, named after what the step scheduled:
  ``execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>)`` (the model
  runner's ``execute_model``; the sampler runs right after it, outside the annotation);
- ``cpu_op`` events (``aten::...``, vLLM's custom ops such as ``vllm::_fused_mul_mat_gguf``
  or ``vllm::unified_mla_attention_with_output``, torch.compile's ``## Call
  CompiledFxGraph ... ##`` regions), CUDA runtime / driver calls with a ``correlation`` id,
  and GPU ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events carrying the correlation id of
  the call that launched them (a CUDA-graph replay's kernels: that of the
  ``cudaGraphLaunch``). There are no phase annotations (no preprocess / forward / sample).

So each step's work is placed by what is observable:

- a step is the CPU time from its annotation to the next step's annotation; steps that
  scheduled no token (``context_0(0)_generation_0(0)``) are left out;
- the forward pass is the CPU span from the step's first to its last forward marker (a
  ``cudaGraphLaunch``, or a torch.compile region when the batch runs eagerly, as a
  prefill chunk does); its kernels are classed by name (``CLASSES``), and where they were
  launched eagerly, a generic kernel (a GGUF activation quantize, a dequantize, a GEMM)
  by the vLLM op that launched it (routed experts or dense linears);
- kernels launched before the forward: input and attention metadata; after it, inside
  the annotation: the LM head (the gather of the last hidden states and the logits
  GEMM, eager, outside the CUDA graph); after the annotation: the sampler (argmax or
  sampling, the copy of the tokens to the host);
- kernels on a second CUDA stream (vLLM runs the shared expert beside the routed ones)
  overlap the others: the rows sum kernel time, so they add up to more than the step by
  that overlap (``side_stream_ms``: the kernel time off the busiest stream);
- the GPU's idle time in the step's cycle (from its first kernel to the next step's first
  kernel, less the union of the kernels' intervals): the CPU time the GPU waits for.

A forward kernel whose name no class matches is counted as "other" and named in
``unmatched`` (the most time first), so that the table can be refined rather than
silently wrong.

``python -m glm5_tools.slicebench classify TRACE.json[.gz] [--json F] [--markdown F]``
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
# CPU events that are the forward pass: a CUDA-graph replay, or torch.compile's regions
FORWARD_MARK = re.compile(r"^(cudaGraphLaunch|## Call CompiledFxGraph|Torch-Compiled Region|Pregraph bytecode"
                          r"|AOTDispatcher Runtime Wrapper)")

# Kernel classes inside the forward pass by kernel name, first match wins. The order
# matters: torch.compile's fused element-wise kernels first (their names quote the ops
# they fused: "moe_forward_shared", "_fused_mul_mat_gguf"), the MoE router's top-k
# before the DSA top-k, the indexer before generic names.
INDUCTOR = "norms, RoPE, activations"
QUANT = "GGUF activation quantize (q8_1)"
DENSE_GGUF = "dense linears"
DENSE_BF16 = "dense linears, bf16 cuBLAS"
ROUTED = "routed experts"
CLASSES: tuple[tuple[str, str], ...] = (
    (INDUCTOR, r"^triton_(poi|red|per)_fused"),
    ("indexer", r"indexer|mqa_logits|fp8_paged_mqa|per_token_group_quant"),
    (ROUTED, r"moe|expert|grouped_topk|topk_softmax|noaux|router"),
    ("top-k and sort", r"topk|top_k|sort_|radix"),
    ("MLA attention", r"mla|decode_attention|flash|fmha|attention|merge_attn|paged|convert_req_index"),
    (QUANT, r"quantize_q8_1"),
    (DENSE_GGUF, r"mul_mat|dequantize|_dense_|_fma_"),
    (DENSE_BF16, r"gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|splitk"),
    ("all-reduce", r"nccl|all_reduce|allreduce|cross_device|one_shot|two_shot"),
    (INDUCTOR, r"norm|rotary|rope|silu|act_and_mul|gelu|sigmoid|softmax|elementwise|reduce_kernel|cat|copy|fill"
               r"|index|scatter|gather|where|arange|cumsum|clamp"),
)
# launched eagerly, a generic kernel goes to the class of the innermost vLLM op above it
# that names one
OP_CLASSES: tuple[tuple[str, str], ...] = (
    (ROUTED, r"_fused_moe_gguf|ggml_moe|moe_align|grouped_topk"),
    (DENSE_GGUF, r"_fused_mul_mat_gguf|ggml_mul_mat"),
)
BY_OP = {QUANT, DENSE_GGUF, DENSE_BF16, INDUCTOR}
OTHER = "other"
MEMCPY = "memcpy / memset"
INPUT = "input and metadata (before the forward)"
LM_HEAD = "LM head (logits, eager)"
SAMPLER = "sampler (after execute_model)"
IDLE = "GPU idle in the step (CPU time)"
_COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in CLASSES]
_OP_COMPILED = [(name, re.compile(pattern)) for name, pattern in OP_CLASSES]
_GPU = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCH = ("cuda_runtime", "cuda_driver")


def kernel_class(name: str) -> str:
    for cls, pattern in _COMPILED:
        if pattern.search(name):
            return cls
    return OTHER


def op_class(ops: tuple[str, ...]) -> str | None:
    """The class that the innermost naming op of a launch's cpu_op stack gives, if any."""
    for op in reversed(ops):
        for cls, pattern in _OP_COMPILED:
            if pattern.search(op):
                return cls
    return None


def row_names() -> list[str]:
    rows = [INPUT]
    for cls, _ in CLASSES[1:] + CLASSES[:1]:  # torch.compile's fused kernels' row after the named ones
        if cls not in rows:
            rows.append(cls)
    return [*rows, OTHER, MEMCPY, LM_HEAD, SAMPLER, IDLE]


def load_trace(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


@dataclass
class Step:
    index: int
    name: str
    tokens: int
    cpu_start: float
    cpu_annot_end: float
    cpu_end: float
    fwd_start: float | None = None
    fwd_end: float | None = None
    gpu_start: float | None = None
    gpu_end: float | None = None
    busy_us: float = 0.0
    cycle_us: float = 0.0
    graphs: int = 0
    by_stream: dict[Any, float] = field(default_factory=dict)
    by_row: dict[str, float] = field(default_factory=dict)
    intervals: list[tuple[float, float]] = field(default_factory=list)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _launch_stacks(events: list[dict[str, Any]]) -> dict[Any, tuple[float, str, tuple[str, ...]]]:
    """correlation id -> (the launch call's time, its name, the cpu_op names enclosing it)."""
    host = sorted((e for e in events if e.get("cat") == "cpu_op" or (
        e.get("cat") in _LAUNCH and "correlation" in e.get("args", {}))),
        key=lambda e: (e.get("tid"), float(e["ts"]), -float(e.get("dur", 0.0)), e.get("cat") != "cpu_op"))
    out: dict[Any, tuple[float, str, tuple[str, ...]]] = {}
    stack: list[tuple[float, str]] = []
    tid: Any = object()
    for e in host:
        ts = float(e["ts"])
        if e.get("tid") != tid:
            tid, stack = e.get("tid"), []
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if e.get("cat") == "cpu_op":
            stack.append((ts + float(e.get("dur", 0.0)), str(e["name"])))
        else:
            out[e["args"]["correlation"]] = (ts, str(e["name"]), tuple(n for _, n in stack))
    return out


def _steps(events: list[dict[str, Any]]) -> list[Step]:
    annotations = sorted((e for e in events if e.get("cat") == "user_annotation" and STEP.match(str(e.get("name")))),
                         key=lambda e: float(e["ts"]))
    if not annotations:
        raise ValueError("classify: no 'execute_context_..._generation_...' step annotation in the trace "
                         "(was it captured while the server ran steps?)")
    steps = []
    for i, e in enumerate(annotations):
        m = STEP.match(str(e["name"]))
        assert m is not None
        start = float(e["ts"])
        end = float(annotations[i + 1]["ts"]) if i + 1 < len(annotations) else float("inf")
        steps.append(Step(i, str(e["name"]), int(m.group(2)) + int(m.group(4)), start,
                          start + float(e["dur"]), end))
    return steps


def classify_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    steps = _steps(events)
    launches = _launch_stacks(events)
    starts = [s.cpu_start for s in steps]

    def step_at(ts: float) -> Step | None:
        i = bisect.bisect_right(starts, ts)  # the last step starting at or before ts
        return steps[i - 1] if i > 0 and ts < steps[i - 1].cpu_end else None

    # the forward pass of each step: its first to last forward marker
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") not in ("cpu_op", *_LAUNCH) or not FORWARD_MARK.match(name):
            continue
        ts = float(e["ts"])
        step = step_at(ts)
        if step is None or ts > step.cpu_annot_end:
            continue
        step.graphs += name == "cudaGraphLaunch"
        end = ts + float(e.get("dur", 0.0))
        step.fwd_start = ts if step.fwd_start is None else min(step.fwd_start, ts)
        step.fwd_end = end if step.fwd_end is None else max(step.fwd_end, end)

    unmatched: dict[str, float] = {}
    kernels = outside = 0
    for e in events:
        cat = e.get("cat")
        if cat not in _GPU:
            continue
        launch = launches.get(e.get("args", {}).get("correlation"))
        step = None if launch is None else step_at(launch[0])
        if launch is None or step is None or step.tokens == 0:
            outside += launch is None or step is None
            continue
        at, call, ops = launch
        kernels += 1
        start, dur = float(e["ts"]), float(e["dur"])
        name = str(e.get("name", ""))
        if at > step.cpu_annot_end:
            row = SAMPLER
        elif step.fwd_start is None or at < step.fwd_start:
            row = INPUT
        elif at > step.fwd_end:  # type: ignore[operator]
            row = LM_HEAD
        elif cat != "kernel":
            row = MEMCPY
        else:
            row = kernel_class(name)
            if row in BY_OP and call != "cudaGraphLaunch":
                row = op_class(ops) or row
            if row == OTHER:
                unmatched[name] = unmatched.get(name, 0.0) + dur
        step.by_row[row] = step.by_row.get(row, 0.0) + dur
        step.by_stream[e.get("tid")] = step.by_stream.get(e.get("tid"), 0.0) + dur
        step.intervals.append((start, start + dur))
        step.gpu_start = start if step.gpu_start is None else min(step.gpu_start, start)
        step.gpu_end = start + dur if step.gpu_end is None else max(step.gpu_end, start + dur)
    active = [s for s in steps if s.gpu_start is not None and s.tokens > 0]
    for i, s in enumerate(active):
        s.busy_us = _union(s.intervals)
        assert s.gpu_start is not None and s.gpu_end is not None
        nxt = active[i + 1].gpu_start if i + 1 < len(active) else None
        s.cycle_us = (nxt - s.gpu_start) if nxt is not None else (s.gpu_end - s.gpu_start)
        s.by_row[IDLE] = max(0.0, s.cycle_us - s.busy_us)
    def side(s: Step) -> float:  # kernel time off the busiest stream: it overlaps the rows' rest
        return (sum(s.by_stream.values()) - max(s.by_stream.values())) / 1e3

    rows = row_names()
    rows += sorted({r for s in active for r in s.by_row} - set(rows))
    # the last step has no next step: its cycle is its GPU span only; leave it out of the
    # median when there are others
    body = active[:-1] if len(active) > 1 else active
    median = {r: statistics.median(s.by_row.get(r, 0.0) / 1e3 for s in body) for r in rows} if body else {}
    return {
        "steps": [{"index": s.index, "name": s.name, "tokens": s.tokens, "graphs": s.graphs,
                   "cycle_ms": s.cycle_us / 1e3, "busy_ms": s.busy_us / 1e3, "side_stream_ms": side(s),
                   "ms": {r: s.by_row.get(r, 0.0) / 1e3 for r in rows}} for s in active],
        "rows": rows,
        "median_ms": median,
        "median_cycle_ms": statistics.median(s.cycle_us / 1e3 for s in body) if body else 0.0,
        "median_busy_ms": statistics.median(s.busy_us / 1e3 for s in body) if body else 0.0,
        "median_side_stream_ms": statistics.median(side(s) for s in body) if body else 0.0,
        "median_tokens": statistics.median(s.tokens for s in body) if body else 0,
        "cuda_graphs": bool(body) and all(s.graphs > 0 for s in body),
        "empty_steps": sum(1 for s in steps if s.tokens == 0),
        "kernels": kernels,
        "kernels_outside_steps": outside,
        "unmatched": dict(sorted(unmatched.items(), key=lambda kv: -kv[1])[:20]),
        "unmatched_ms_per_step": sum(unmatched.values()) / 1e3 / len(active) if active else 0.0,
    }


def classify(path: Path) -> dict[str, Any]:
    result = classify_events(load_trace(path))
    result["trace"] = path.name
    return result


def markdown(tables: dict[str, dict[str, Any]]) -> str:
    """One column per capture (label -> classify's result): the median step's ms by row."""
    labels = list(tables)
    rows: list[str] = []
    for t in tables.values():
        rows += [r for r in t["rows"] if r not in rows]
    head = "| ms per step (median) | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels) + "\n"
    lines = []
    for r in rows:
        values = [tables[lb]["median_ms"].get(r, 0.0) for lb in labels]
        if any(v >= 0.0005 for v in values):
            lines.append(f"| {r} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines.append("| **step (cycle)** | " + " | ".join(f"**{tables[lb]['median_cycle_ms']:.3f}**" for lb in labels)
                 + " |")
    lines.append("| GPU busy | " + " | ".join(f"{tables[lb]['median_busy_ms']:.3f}" for lb in labels) + " |")
    lines.append("| of the rows: kernels on a second stream (overlapping) | " + " | ".join(
        f"{tables[lb].get('median_side_stream_ms', 0.0):.3f}" for lb in labels) + " |")
    lines.append("| tokens per step | " + " | ".join(f"{tables[lb].get('median_tokens', 0):g}" for lb in labels)
                 + " |")
    lines.append("| forward as CUDA graph | " + " | ".join(
        "yes" if tables[lb].get("cuda_graphs") else "no (eager)" for lb in labels) + " |")
    lines.append("| steps captured | " + " | ".join(str(len(tables[lb]["steps"])) for lb in labels) + " |")
    return head + "\n".join(lines) + "\n"
