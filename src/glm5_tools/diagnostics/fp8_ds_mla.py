"""vLLM's fp8_ds_mla latent-cache layout, written on the CPU (stage 8's cache writer).

With ``--kv-cache-dtype fp8`` and the TRITON_MLA_SPARSE backend (patch 0013) vLLM keeps
each token's MLA latent in the layout of DeepSeek's FlashMLA (``fp8_ds_mla``), written by
its CUDA op ``concat_and_cache_mla``. One row of ``row_bytes()`` = 656 bytes per token
and layer (GLM-5's kv_lora_rank 512, rope 64):

* bytes 0-511: the 512 latent values in float8 e4m3 (fn: no infinities), each
  ``value / scale`` of its tile rounded to nearest-even, saturating;
* bytes 512-527: 4 float32 scales, one per tile of 128 values: the tile's largest
  magnitude / 448, at least the smallest normal float32 (FLT_MIN: a tile of zeros);
* bytes 528-655: the 64 rope values as they came (16-bit, the model's dtype).

The CUDA op takes 16-bit inputs only (it refuses others), so this writer does too. Its
bytes are compared with the GPU writer's, recorded on the GPU validation machine for a
fixed input (``probe_input``; tools/gpu/record_fp8_writer.py), in
devtests/ml/forward/test_fp8_ds_mla_writer.py.
"""

from __future__ import annotations

import torch

LORA = 512
ROPE = 64
TILE = 128
FP8_MAX = 448.0
FLT_MIN = float(torch.finfo(torch.float32).tiny)
PAGE = 64


def row_bytes(lora: int = LORA, rope: int = ROPE) -> int:
    """Bytes of one token's row: the e4m3 latent, one fp32 scale per tile, 16-bit rope."""
    return lora + 4 * (lora // TILE) + 2 * rope


def encode_rows(kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """The fp8_ds_mla rows [T, row_bytes] (uint8) of latents kv_c [T, 512] and rope
    values k_pe [T, 64], both 16-bit (bf16 or fp16) like the CUDA op's inputs."""
    for name, t in (("kv_c", kv_c), ("k_pe", k_pe)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"fp8_ds_mla writer: {name} is {t.dtype}; vLLM's writer takes 16-bit inputs only")
    n, lora = kv_c.shape
    if lora % TILE or k_pe.shape[0] != n:
        raise ValueError(f"fp8_ds_mla writer: kv_c {tuple(kv_c.shape)}, k_pe {tuple(k_pe.shape)}")
    tiles = kv_c.float().reshape(n, lora // TILE, TILE)
    scale = (tiles.abs().amax(-1) / FP8_MAX).clamp(min=FLT_MIN)
    # the value / its tile's scale in float32, rounded to nearest-even e4m3; the
    # quotient is at most 448 (the tile's largest value) up to one float32 rounding,
    # which e4m3's rounding absorbs, so saturation never takes effect
    q = (tiles / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, lora)
    return torch.cat([q.view(torch.uint8), scale.contiguous().view(torch.uint8),
                      k_pe.contiguous().view(torch.uint8)], dim=1)


def write(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """What ``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, "fp8_ds_mla", scale)``
    does: row ``slot`` of the paged uint8 cache [blocks, page, row_bytes] gets the token's
    row; slot -1 is padding (skipped). Tokens past slot_mapping's length are not written."""
    if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != row_bytes(kv_c.shape[1], k_pe.shape[1]):
        raise ValueError(f"fp8_ds_mla writer: cache {kv_cache.dtype} rows of {kv_cache.shape[-1]}, expected uint8 "
                         f"rows of {row_bytes(kv_c.shape[1], k_pe.shape[1])} bytes")
    n = slot_mapping.shape[0]
    keep = slot_mapping >= 0
    rows = encode_rows(kv_c[:n][keep], k_pe[:n][keep])
    kv_cache.view(-1, kv_cache.shape[-1])[slot_mapping[keep].long()] = rows


def decode_rows(rows: torch.Tensor, lora: int = LORA) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 latent [N, lora] (e4m3 value x its tile's scale) and the raw 16-bit rope
    bytes' values as bf16 [N, rope] of fp8_ds_mla rows [N, row_bytes]."""
    rows = rows.reshape(-1, rows.shape[-1]).contiguous()
    n = rows.shape[0]
    vals = rows[:, :lora].contiguous().view(torch.float8_e4m3fn).float()
    scales = rows[:, lora:lora + 4 * (lora // TILE)].contiguous().view(torch.float32)
    latent = (vals.reshape(n, lora // TILE, TILE) * scales[..., None]).reshape(n, lora)
    rope = rows[:, lora + 4 * (lora // TILE):].contiguous().view(torch.bfloat16)
    return latent, rope


def probe_input(seed: int = 20261207) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """A fixed input for comparing writers byte for byte: (kv_c [T, 512] bf16, k_pe [T, 64]
    bf16, slot_mapping [T] int64 with -1 padding, the cache shape (blocks, 64, 656)).

    Besides latents of the model's scale (|x| ~ 1, with outliers so the 4 tiles' scales
    differ) it holds the corners where two writers could round differently: a tile of
    zeros (scale FLT_MIN), tiles whose scale is a power of two with values exactly
    halfway between two e4m3 values (ties to even) and just off them, values that land
    in e4m3's subnormal range, signed zeros, the tile maximum itself (448 after scaling),
    bf16 subnormal latents, and rope values of every magnitude bf16 has. Slots are
    shuffled over two pages of the cache, with padding tokens (-1)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    # 1-24: the model's scale, a few outliers
    x = torch.randn(24, LORA, generator=gen)
    x[torch.rand(24, LORA, generator=gen) < 0.01] *= 8.0
    rows.append(x)
    # 25: tile 0 zeros, tile 1 one nonzero value, tiles 2-3 signed zeros and -tile max
    r = torch.zeros(LORA)
    r[TILE + 5] = 3.0
    r[2 * TILE:3 * TILE] = -0.0
    r[3 * TILE] = -7.5
    rows.append(r[None])
    # 26-29: scale a power of two (tile max 448 * 2^k): e4m3 ties and values next to them
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = ((e4m3[1:] + e4m3[:-1]) / 2).to(torch.bfloat16)  # exact in bf16 (4 significant bits)
    for k in (-6, -2, 0, 3):
        t = torch.empty(LORA, dtype=torch.bfloat16)
        for j in range(LORA // TILE):
            tile = mids[torch.randint(0, mids.numel(), (TILE,), generator=gen)]
            if j % 2:  # one bf16 step either side of the tie
                up = torch.rand(TILE, generator=gen) < 0.5
                tile = torch.where(up, torch.nextafter(tile, tile + 1), torch.nextafter(tile, tile - 1))
            tile[0] = FP8_MAX
            tile[1::2] *= -1
            t[j * TILE:(j + 1) * TILE] = tile * 2.0**k
        rows.append(t[None].float())
    # 30-31: e4m3 subnormals (values below 2^-6 of the scale) and one large value per tile
    for span in (2.0**-6, 2.0**-9):
        t = torch.rand(LORA, generator=gen) * span * (FP8_MAX / 2)
        t[::TILE] = FP8_MAX / 2
        t[1::3] *= -1
        rows.append(t[None])
    # 32: bf16 subnormal latents (a tile whose scale falls below FLT_MIN)
    t = torch.randn(LORA, generator=gen) * 1e-39
    t[TILE:] = torch.randn(LORA - TILE, generator=gen)
    rows.append(t[None])
    kv_c = torch.cat(rows).to(torch.bfloat16)
    n = kv_c.shape[0]
    k_pe = torch.randn(n, ROPE, generator=gen) * torch.logspace(-36, 36, ROPE)
    k_pe[:, :4] = torch.tensor([0.0, -0.0, 1e-40, -65504.0])
    k_pe = k_pe.to(torch.bfloat16)
    blocks = 2
    slots = torch.randperm(blocks * PAGE, generator=gen)[:n].to(torch.int64)
    slots[torch.tensor([3, 17, 29])] = -1
    return kv_c, k_pe, slots, (blocks, PAGE, row_bytes())
