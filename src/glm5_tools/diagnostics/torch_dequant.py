"""An independent dequantizer in plain PyTorch for the GGML types UD-Q4_K_XL files use.

Written from the GGML block layouts, not from gguf-py or vLLM, so that stage 1 has a
second opinion on machines without a GPU (CI). Types it does not know are skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 13, 14, 30
QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 little-endian halves -> float32 [n, 1]."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    q = b[:, 2:34].contiguous().view(torch.int8).to(torch.float32)
    return d * q


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    qs = b[:, 2:18].to(torch.int32)
    q = torch.cat([qs & 0xF, qs >> 4], dim=1).to(torch.float32) - 8.0
    return d * q


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins packed in 12 bytes ([n, 12] -> [n, 8] each)."""
    s = s.to(torch.int32)
    sc = torch.empty(s.shape[0], 8, dtype=torch.int32)
    mn = torch.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].to(torch.int32).view(-1, 4, 32)
    q = torch.stack([qs & 0xF, qs >> 4], dim=2).view(-1, 8, 32).to(torch.float32)
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).view(-1, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48].to(torch.int32)  # [n, 32]
    qs = b[:, 48:176].to(torch.int32).view(-1, 4, 32)
    lo = torch.stack([qs & 0xF, qs >> 4], dim=2).view(-1, 8, 32)
    bits = torch.arange(8, dtype=torch.int32)
    hi = ((qh[:, None, :] >> bits[None, :, None]) & 1) << 4  # sub-block j uses bit j
    q = (lo + hi).to(torch.float32)
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).view(-1, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    ql = b[:, 0:128].to(torch.int32).view(-1, 2, 64)
    qh = b[:, 128:192].to(torch.int32).view(-1, 2, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32).view(-1, 2, 8)
    d = _f16(b[:, 208:210])
    out = torch.empty(b.shape[0], 2, 128, dtype=torch.float32)
    for part in range(4):
        low = ql[:, :, (part % 2) * 32:(part % 2) * 32 + 32]
        low = low & 0xF if part < 2 else low >> 4
        high = (qh >> (2 * part)) & 3
        q = (low | (high << 4)) - 32
        s = sc[:, :, 2 * part: 2 * part + 2].repeat_interleave(16, dim=2)
        out[:, :, part * 32: part * 32 + 32] = s * q.to(torch.float32)
    return (d[:, :, None] * out).view(-1, QK_K)


_BLOCKS: dict[int, tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]] = {
    Q8_0: (32, 34, _q8_0),
    Q4_0: (32, 18, _q4_0),
    Q4_K: (QK_K, 144, _q4_k),
    Q5_K: (QK_K, 176, _q5_k),
    Q6_K: (QK_K, 210, _q6_k),
}


def supported(qtype: int) -> bool:
    return qtype in _BLOCKS or qtype in (F32, F16, BF16)


def dequantize(raw: np.ndarray, qtype: int) -> torch.Tensor:
    """[rows, bytes] raw GGML rows -> float32 [rows, elements]."""
    if qtype == F32:
        return torch.from_numpy(np.ascontiguousarray(raw).view(np.float32).copy())
    if qtype == F16:
        return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).astype(np.float32))
    if qtype == BF16:
        u = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint16).astype(np.int32))
        return (u << 16).view(torch.float32)
    _block, nbytes, fn = _BLOCKS[qtype]
    data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).copy())
    rows = data.shape[0]
    blocks = fn(data.reshape(-1, nbytes))
    return blocks.reshape(rows, -1)
