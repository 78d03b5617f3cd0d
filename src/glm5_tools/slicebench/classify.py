"""Where each millisecond of a served step goes: a torch profiler trace, by class of work.

Reads the Chrome-format trace that vLLM 0.20.2's torch profiler writes
(``--profiler-config '{"profiler": "torch", ...}'``, one ``*.pt.trace.json.gz`` per
worker) and splits every engine step into:

- the phase the model runner was in when it launched the work, from its own
  annotations (``gpu_model_runner: preprocess | forward | postprocess | sample | draft``):
  postprocess is the LM head (``compute_logits``, eager, outside the CUDA graphs), sample
  the sampler, draft the MTP drafter, preprocess the input and attention metadata;
- inside ``forward`` (the CUDA-graph replay, or the eager pieces), the class of each GPU
  kernel by its name (``CLASSES``: the DSA indexer, top-k and sort, MLA attention,
  routed experts and their router, dense linears, norms / RoPE / activations /
  element-wise, all-reduce, other);
- the GPU's idle time in the step's cycle (from its first kernel to the next step's first
  kernel, less the union of the kernels' intervals): the CPU time between graph replays
  that the GPU waits for (scheduling, metadata, Python).

Kernels launched from a CUDA graph carry the correlation id of the ``cudaGraphLaunch``
call, so they are placed by where that call was made. A kernel whose name no class
matches is counted as "other" and named in ``unmatched`` (the most time first), so that
the table can be refined rather than silently wrong.

``python -m glm5_tools.slicebench classify TRACE.json[.gz] [--out table.json]
[--markdown table.md] [--label NAME]``
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("preprocess", "forward", "postprocess", "sample", "draft")
ANNOTATION = "gpu_model_runner: "

# Kernel classes inside the forward pass, first match wins (the order matters: the MoE
# router's top-k before the DSA top-k, the indexer before generic names).
CLASSES: tuple[tuple[str, str], ...] = (
    ("indexer", r"indexer|mqa_logits|lightning|fp8_paged_mqa"),
    ("routed experts", r"moe|expert|grouped_topk|topk_softmax|noaux|router"),
    ("top-k and sort", r"topk|top_k|sort|radix"),
    ("MLA attention", r"mla|decode_attention|flash|fmha|attention|_fwd_kernel|merge_attn|cache_mla|paged"),
    ("dense linears", r"mul_mat|dequantize|quantize_q8|gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|splitk|sm90_|sm80_"),
    ("all-reduce", r"nccl|all_reduce|allreduce|cross_device|one_shot|two_shot"),
    ("norms, RoPE, activations", r"norm|rotary|rope|silu|act_and_mul|gelu|sigmoid|softmax|triton_(poi|red|per)_fused"
                                 r"|elementwise|reduce|cat|copy|fill|index|scatter|gather|where|arange|cumsum|clamp"),
)
OTHER = "other"
MEMCPY = "memcpy / memset"
PHASE_ROWS = {"preprocess": "input and metadata (preprocess)", "postprocess": "LM head (logits)",
              "sample": "sampler", "draft": "MTP drafter"}
IDLE = "GPU idle between replays (CPU time)"
_COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in CLASSES]


def kernel_class(name: str) -> str:
    for cls, pattern in _COMPILED:
        if pattern.search(name):
            return cls
    return OTHER


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
    cpu_start: float
    cpu_end: float
    gpu_start: float | None = None
    gpu_end: float | None = None
    busy_us: float = 0.0
    cycle_us: float = 0.0
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


def _phase_at(spans: list[tuple[float, float, str]], ts: float) -> str:
    for start, end, phase in spans:
        if start <= ts <= end:
            return phase
    return "other"


def classify_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    annotations = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(ANNOTATION)),
        key=lambda e: float(e["ts"]))
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"])[len(ANNOTATION):])
             for e in annotations]
    forwards = [s for s in spans if s[2] == "forward"]
    if not forwards:
        raise ValueError("classify: no 'gpu_model_runner: forward' annotation in the trace "
                         "(was it captured while the server ran steps?)")
    # a step runs from its preprocess (else its forward) start to the next step's
    pre = [s[0] for s in spans if s[2] == "preprocess"]
    starts = pre if len(pre) == len(forwards) else [f[0] for f in forwards]
    steps = [Step(i, starts[i], starts[i + 1] if i + 1 < len(starts) else float("inf")) for i in range(len(starts))]
    launch_ts: dict[Any, float] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch_ts[e["args"]["correlation"]] = float(e["ts"])
    unmatched: dict[str, float] = {}
    kernels = 0
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = e.get("args", {}).get("correlation")
        if corr not in launch_ts:
            continue
        at = launch_ts[corr]
        step = next((s for s in steps if s.cpu_start <= at < s.cpu_end), None)
        if step is None:
            continue
        kernels += 1
        start, dur = float(e["ts"]), float(e["dur"])
        phase = _phase_at(spans, at)
        name = str(e.get("name", ""))
        if cat != "kernel":
            row = MEMCPY
        elif phase == "forward":
            row = kernel_class(name)
            if row == OTHER:
                unmatched[name] = unmatched.get(name, 0.0) + dur
        elif phase in PHASE_ROWS:
            row = PHASE_ROWS[phase]
        else:
            row = f"{OTHER} ({phase})"
        step.by_row[row] = step.by_row.get(row, 0.0) + dur
        step.intervals.append((start, start + dur))
        step.gpu_start = start if step.gpu_start is None else min(step.gpu_start, start)
        step.gpu_end = start + dur if step.gpu_end is None else max(step.gpu_end, start + dur)
    active = [s for s in steps if s.gpu_start is not None]
    for i, s in enumerate(active):
        s.busy_us = _union(s.intervals)
        assert s.gpu_start is not None and s.gpu_end is not None
        nxt = active[i + 1].gpu_start if i + 1 < len(active) else None
        s.cycle_us = (nxt - s.gpu_start) if nxt is not None else (s.gpu_end - s.gpu_start)
        s.by_row[IDLE] = max(0.0, s.cycle_us - s.busy_us)
    rows = [c for c, _ in CLASSES] + [OTHER, MEMCPY] + [PHASE_ROWS[p] for p in PHASES if p in PHASE_ROWS] + [IDLE]
    extra = sorted({r for s in active for r in s.by_row} - set(rows))
    rows += extra
    # the last step has no next step: its cycle is its GPU span only; leave it out of the
    # median when there are others
    body = active[:-1] if len(active) > 1 else active
    median = {r: statistics.median(s.by_row.get(r, 0.0) / 1e3 for s in body) for r in rows} if body else {}
    return {
        "steps": [{"index": s.index, "cycle_ms": s.cycle_us / 1e3, "busy_ms": s.busy_us / 1e3,
                   "ms": {r: s.by_row.get(r, 0.0) / 1e3 for r in rows}} for s in active],
        "rows": rows,
        "median_ms": median,
        "median_cycle_ms": statistics.median(s.cycle_us / 1e3 for s in body) if body else 0.0,
        "median_busy_ms": statistics.median(s.busy_us / 1e3 for s in body) if body else 0.0,
        "kernels": kernels,
        "unmatched": dict(sorted(unmatched.items(), key=lambda kv: -kv[1])[:20]),
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
    lines.append("| steps captured | " + " | ".join(str(len(tables[lb]["steps"])) for lb in labels) + " |")
    return head + "\n".join(lines) + "\n"
