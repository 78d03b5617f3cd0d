"""PROJECTION (not a measurement): the measured per-rank step on 8x RTX PRO 6000 at TP 8.

From one run's results.json (``collect``): the per-step breakdown by class of the
profiled captures (decode at 1 and 64 concurrent, a prefill chunk) of the N-layer slice,
measured on the GPU validation machine (H100 or H200). Each row of a step becomes:

- the forward pass's classes (indexer, top-k, MLA, experts, linears, norms, other, copies):
  per layer, so x 78 / N;
- the LM head: the slice's is the whole vocabulary, a TP-8 rank's is vocab / 8, so x 1/8;
- sampler, input preparation, MTP drafter: once per step, as measured;
- then the card: memory-bound rows x (the GPU's copy bandwidth measured in the run /
  the RTX PRO 6000's published 1,792 GB/s); compute-bound rows (the prefill chunk's
  linears, experts, attention and indexer) x (the measured card's published dense
  BF16 tensor throughput / the RTX PRO 6000's, ``PRO6000_BF16_TFLOPS``);
- the GPU's idle time between graph replays (CPU time): as measured (the target box's CPU
  is not known here);
- plus what TP 8 adds and one GPU cannot measure: 2 all-reduces of the hidden state per
  layer (after attention, after the MLP), t = latency + 2 (n-1)/n x bytes / bus
  bandwidth, at NCCL's published latency on that box (20-28 us for 12-32 KB; 24 us
  taken) and, as a second row, at FlashInfer's one-shot PCIe all-reduce (~12 us); and
  the LM head's logits gathered from the 8 ranks once per step.

Copy bandwidth is counted as bytes read + written (the way KINDS.md measures it), against
a datasheet figure for the RTX PRO 6000: the ratio flatters the RTX PRO 6000 by the
fraction of its datasheet bandwidth a copy really reaches (~90 % on the H100).

``python -m glm5_tools.slicebench project results.json [--markdown OUT.md] [--json OUT.json]``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glm5_tools.slicebench.classify import (
    CLASSES,
    DENSE_BF16,
    DENSE_GGUF,
    IDLE,
    LM_HEAD,
    MEMCPY,
    OTHER,
    ROUTED,
)

REAL_LAYERS = 78
TP = 8
HIDDEN = 6144
PRO6000_GBPS = 1792.0  # RTX PRO 6000 Blackwell: 512-bit GDDR7 at 28 Gbps (datasheet)
# Dense FP16/BF16 tensor throughput of the RTX PRO 6000 Blackwell: its datasheet gives
# 4,000 AI TOPS (FP4, with sparsity); dense FP16/BF16 is 1/8 of that.
PRO6000_BF16_TFLOPS = 500.0
# Published dense BF16 tensor throughput of the cards the slice is measured on.
MEASURED_CARD_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}
NCCL_LATENCY_US = 24.0  # published NCCL all-reduce latency, 8x RTX PRO 6000 over PCIe, 12-32 KB: 20-28 us
NCCL_LATENCY_RANGE_US = (20.0, 28.0)
FLASHINFER_ONESHOT_US = 12.0  # FlashInfer's one-shot PCIe all-reduce, small messages
# Bus bandwidth of an all-reduce of large messages over PCIe 5.0 without NVLink: an
# ASSUMPTION (no measurement of that box is recorded yet); it matters for batches of
# many tokens (a prefill chunk's 8,192 x 6,144 x 2 bytes), not for single-stream decode.
ALLREDUCE_BUSBW_GBPS = 25.0
GOALS = {"single-stream decode tok/s": 100.0, "aggregate tok/s at 64": 1500.0, "prefill tok/s at 8k": 6000.0}

PER_LAYER_ROWS = {c for c, _ in CLASSES} | {OTHER, MEMCPY}
COMPUTE_BOUND_IN_PREFILL = {DENSE_GGUF, DENSE_BF16, ROUTED, "MLA attention", "indexer"}


@dataclass(frozen=True)
class AllReduce:
    name: str
    latency_us: float
    busbw_gbps: float = ALLREDUCE_BUSBW_GBPS

    def us(self, nbytes: float, ranks: int = TP) -> float:
        return self.latency_us + 2 * (ranks - 1) / ranks * nbytes / (self.busbw_gbps * 1e3)


MODELS = (AllReduce("NCCL (published PCIe latency 24 us)", NCCL_LATENCY_US),
          AllReduce("FlashInfer one-shot PCIe (~12 us)", FLASHINFER_ONESHOT_US))


def card_key(name: str) -> str:
    for key in MEASURED_CARD_BF16_TFLOPS:
        if key in name:
            return key
    raise ValueError(f"project: no published throughput for the measured card {name!r} "
                     f"(known: {', '.join(MEASURED_CARD_BF16_TFLOPS)})")


def project_capture(cap: dict[str, Any], *, layers: int, copy_gbps: float, card: str,
                    model: AllReduce) -> dict[str, Any]:
    """One capture (classify's result plus batch, tokens_per_step, kind) on the target."""
    mem = copy_gbps / PRO6000_GBPS
    compute = MEASURED_CARD_BF16_TFLOPS[card_key(card)] / PRO6000_BF16_TFLOPS
    prefill = cap["kind"] == "prefill"
    rows: dict[str, float] = {}
    for row, ms in cap["median_ms"].items():
        if row == IDLE:
            rows[row] = ms
            continue
        scaled = ms * REAL_LAYERS / layers if row in PER_LAYER_ROWS else ms
        if row == LM_HEAD:
            scaled /= TP
        bound = compute if prefill and row in COMPUTE_BOUND_IN_PREFILL else mem
        rows[row] = scaled * bound
    tokens = int(cap["tokens_per_step"])
    rows["all-reduce x 2 per layer (TP 8)"] = 2 * REAL_LAYERS * model.us(tokens * HIDDEN * 2) / 1e3
    sequences = int(cap.get("batch", 1)) if not prefill else 1
    logits_bytes = sequences * cap.get("vocab", 154880) * 2
    rows["logits gather (TP 8)"] = model.us(logits_bytes / 2) / 1e3  # all-gather: half an all-reduce's traffic
    step = sum(rows.values())
    out: dict[str, Any] = {"rows": rows, "step_ms": step}
    if prefill:
        out["prefill_tok_s"] = tokens / step * 1e3
    else:
        out["tok_s_per_user"] = 1e3 / step
        out["aggregate_tok_s"] = sequences * 1e3 / step
    return out


def project(results: dict[str, Any]) -> dict[str, Any]:
    layers = int(results["layers"])
    copy_gbps = float(results["device"]["copy_GBps"])
    card = str(results["device"]["name"])
    out: dict[str, Any] = {
        "projection": True,
        "measured_on": card,
        "slice_layers": layers,
        "assumptions": {
            "pro6000_GBps": PRO6000_GBPS, "measured_copy_GBps": copy_gbps,
            "memory_scale": copy_gbps / PRO6000_GBPS,
            "compute_scale": MEASURED_CARD_BF16_TFLOPS[card_key(card)] / PRO6000_BF16_TFLOPS,
            "pro6000_bf16_tflops": PRO6000_BF16_TFLOPS, "allreduce_busbw_GBps": ALLREDUCE_BUSBW_GBPS,
            "nccl_latency_us": NCCL_LATENCY_US, "nccl_latency_range_us": NCCL_LATENCY_RANGE_US,
            "flashinfer_oneshot_us": FLASHINFER_ONESHOT_US,
        },
        "models": {},
    }
    for model in MODELS:
        captures = {label: project_capture(cap, layers=layers, copy_gbps=copy_gbps, card=card, model=model)
                    for label, cap in results["profile"].items()}
        out["models"][model.name] = {"captures": captures, "goals": goals(results["profile"], captures)}
    return out


def goals(profile: dict[str, Any], captures: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    got: dict[str, float | None] = dict.fromkeys(GOALS)
    for label, cap in profile.items():
        c = captures[label]
        if cap["kind"] == "decode" and int(cap.get("batch", 0)) == 1:
            got["single-stream decode tok/s"] = c["tok_s_per_user"]
        elif cap["kind"] == "decode" and int(cap.get("batch", 0)) == 64:
            got["aggregate tok/s at 64"] = c["aggregate_tok_s"]
        elif cap["kind"] == "prefill" and int(cap.get("batch", 1)) == 1:  # one chunk of max_num_batched_tokens
            got["prefill tok/s at 8k"] = c["prefill_tok_s"]
    return {k: {"goal": GOALS[k], "projected": v, "ratio": (v / GOALS[k]) if v else None} for k, v in got.items()}


def markdown(proj: dict[str, Any]) -> str:
    a = proj["assumptions"]
    lines = [
        f"**PROJECTION, not a measurement**: 8x RTX PRO 6000 at TP 8, 78 layers, from the {proj['slice_layers']}-layer "
        f"slice measured on one {proj['measured_on']} (memory-bound work x {a['memory_scale']:.2f}: "
        f"{a['measured_copy_GBps']:.0f} GB/s copy measured / {a['pro6000_GBps']:.0f} GB/s published; "
        f"compute-bound x {a['compute_scale']:.2f}: published dense BF16; all-reduce bus bandwidth "
        f"{a['allreduce_busbw_GBps']:.0f} GB/s assumed).",
        "",
    ]
    for name, m in proj["models"].items():
        caps = m["captures"]
        labels = list(caps)
        rows: list[str] = []
        for c in caps.values():
            rows += [r for r in c["rows"] if r not in rows]
        lines.append(f"All-reduce: {name}")
        lines.append("")
        lines.append("| projected ms per step | " + " | ".join(labels) + " |")
        lines.append("|---|" + "---|" * len(labels))
        for r in rows:
            vals = [caps[lb]["rows"].get(r, 0.0) for lb in labels]
            if any(v >= 0.0005 for v in vals):
                lines.append(f"| {r} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        lines.append("| **step** | " + " | ".join(f"**{caps[lb]['step_ms']:.3f}**" for lb in labels) + " |")
        for key, title in (("tok_s_per_user", "tok/s per user"), ("aggregate_tok_s", "tok/s aggregate"),
                           ("prefill_tok_s", "prefill tok/s")):
            if any(key in caps[lb] for lb in labels):
                lines.append(f"| {title} | " + " | ".join(
                    f"{caps[lb][key]:.0f}" if key in caps[lb] else "" for lb in labels) + " |")
        lines.append("")
        lines.append("| goal | wanted | projected | projected / wanted |")
        lines.append("|---|---|---|---|")
        for goal, g in m["goals"].items():
            proj_v = "not captured" if g["projected"] is None else f"{g['projected']:.0f}"
            ratio = "" if g["ratio"] is None else f"{g['ratio']:.2f}"
            lines.append(f"| {goal} | {g['goal']:.0f} | {proj_v} | {ratio} |")
        lines.append("")
    return "\n".join(lines)
