"""Stage 1: GGUF dequantization, the kernel under test against gguf-py's CPU reference.

On a GPU the kernel under test is vLLM's own (torch.ops._C.ggml_dequantize, the one the
server runs). Without one (CI) it is this package's independent PyTorch dequantizer
(torch_dequant): that proves the file and the reference agree, not vLLM's kernel, and the
`where` column says which ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from glm5_tools.diagnostics import torch_dequant
from glm5_tools.diagnostics.gguf_io import FLOAT_TYPES, GGUFTensor, dequantize_rows, rows_view
from glm5_tools.diagnostics.result import StageResult

NAME = "gguf dequantization"
# max |kernel - reference| / max |reference| per tensor. vLLM's kernel computes and
# writes in float16: d*scale, then *q, then - dmin*min, each rounded at 2^-11
# (4.9e-4) of its size; measured on the H200 up to 7.7e-4 (docs/validation/
# diagnostics.md). 4e-3 (eight half-precision roundings) stays far below a wrong
# block layout or scale decoding, which moves values by their own order (>= 0.5).
TOLERANCE = 4e-3

# (raw rows [n, bytes], ggml type, rows, columns) -> float32 [n, columns]
Dequantizer = Callable[[np.ndarray, int, int, int], torch.Tensor]


def vllm_gpu_dequantizer(device: str) -> Dequantizer:
    from vllm import _custom_ops as ops

    def run(raw: np.ndarray, qtype: int, m: int, n: int) -> torch.Tensor:
        w = torch.from_numpy(np.ascontiguousarray(raw)).to(device)
        out = ops.ggml_dequantize(w, qtype, m, n, torch.float16)
        return out.float().cpu()

    return run


def torch_cpu_dequantizer(raw: np.ndarray, qtype: int, m: int, n: int) -> torch.Tensor:
    return torch_dequant.dequantize(raw, qtype).reshape(m, n)


@dataclass
class Sample:
    name: str
    type_name: str
    rows: int
    err: float
    abs_err: float


def sample_tensors(tensors: dict[str, GGUFTensor], per_type: int) -> list[GGUFTensor]:
    """Up to per_type tensors of each quantized type, spread over the file."""
    by_type: dict[int, list[GGUFTensor]] = {}
    for t in tensors.values():
        if t.qtype not in FLOAT_TYPES:
            by_type.setdefault(t.qtype, []).append(t)
    picked: list[GGUFTensor] = []
    for group in by_type.values():
        group.sort(key=lambda t: t.name)
        step = max(1, len(group) // per_type)
        picked.extend(group[::step][:per_type])
    return picked


def run_stage(
    tensors: dict[str, GGUFTensor],
    dequantizer: Dequantizer,
    where: str,
    per_type: int = 3,
    max_rows: int = 64,
    supports: Callable[[int], bool] | None = None,
) -> StageResult:
    samples: list[Sample] = []
    skipped: list[str] = []
    rng = np.random.default_rng(0)
    for t in sample_tensors(tensors, per_type):
        if supports is not None and not supports(t.qtype):
            skipped.append(f"{t.name} ({t.type_name}): the dequantizer here has no such type")
            continue
        rows = rows_view(t)
        idx = np.unique(np.concatenate([
            np.arange(min(8, rows.shape[0])),
            rng.integers(0, rows.shape[0], size=min(max_rows, rows.shape[0])),
        ]))[:max_rows]
        sub = np.ascontiguousarray(rows[idx])
        ref = torch.from_numpy(dequantize_rows(t, sub))
        got = dequantizer(sub, t.qtype, ref.shape[0], ref.shape[1])
        diff = (got.float() - ref).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        scale = float(ref.abs().max()) or 1.0
        if not torch.isfinite(got).all():
            abs_err = float("nan")
        samples.append(Sample(t.name, t.type_name, len(idx), abs_err / scale, abs_err))
    if not samples:
        return StageResult.skip(1, NAME, "no quantized tensor this dequantizer can check"
                                + (f"; {len(skipped)} skipped" if skipped else ""))
    worst = max(samples, key=lambda s: (np.isnan(s.err), s.err))
    details = [
        f"{s.type_name:6s} {s.name}: {s.rows} rows, max abs diff {s.abs_err:.3e}, "
        f"relative {s.err:.3e}"
        for s in samples
    ]
    details.extend(skipped)
    types = sorted({s.type_name for s in samples})
    details.insert(0, f"types checked: {', '.join(types)}; worst {worst.name} ({worst.type_name})")
    return StageResult.judge(1, NAME, worst.err, TOLERANCE, where, details)
