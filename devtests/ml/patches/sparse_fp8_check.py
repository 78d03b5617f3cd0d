"""Patch 0013's fp8 latent cache for TRITON_MLA_SPARSE, against float32 torch.

usage: TRITON_INTERPRET=1 python sparse_fp8_check.py [--device cuda] [--vllm-writer]
(prints one JSON object). Runs on an overlay (PYTHONPATH) with the patch set;
on a GPU (no TRITON_INTERPRET) the same checks run with the device given by
--device cuda, and --vllm-writer fills the cache with vLLM's own
concat_and_cache_mla (docs/validation/e2e-gpu/fp8/README.md).

* write_fp8_ds_mla: this project's torch writer of vLLM's fp8_ds_mla rows (per
  token: 512 e4m3 latent values, 4 fp32 scales = each 128-value tile's largest
  magnitude / 448, 64 bf16 rope values; 656 bytes). Its round trip
  (read_fp8_ds_mla) is checked against the bf16 input: within e4m3's half-ulp
  of each tile, rope bit-exact.
* sparse_mla over the fp8 cache against float32 softmax attention over the
  dequantized cache (the kernel's own error: tight), and against sparse_mla
  over the bf16 cache the rows came from (the quantization error), with one
  and several splits and rows with no selection.

The faults (devtests/ml/patches/faults/fp8-*.patch, applied on top of the
set by test_triton_sparse_mla_fp8.py): the kernel reads the next tile's scale
(a wrong scale index); the rope part read from where the scales are.
"""

from __future__ import annotations

import json
import sys

import torch

HEADS, LORA, ROPE, PAGE = 8, 512, 64, 64
TILE = 128
FP8_MAX = 448.0


def write_fp8_ds_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write tokens' latent kv_c [T, 512] and rope k_pe [T, 64] (bf16) into the
    uint8 cache [blocks, page, 656] at global slots [T] (-1 = skip)."""
    flat = cache.view(-1, cache.shape[-1])
    lora = kv_c.shape[1]
    tiles = kv_c.float().view(kv_c.shape[0], lora // TILE, TILE)
    scale = (tiles.abs().amax(-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (tiles / scale[..., None]).view(kv_c.shape[0], lora).to(torch.float8_e4m3fn)
    rows = torch.cat(
        [
            q.view(torch.uint8),
            scale.contiguous().view(torch.uint8),
            k_pe.to(torch.bfloat16).contiguous().view(torch.uint8),
        ],
        dim=1,
    )
    keep = slots >= 0
    flat[slots[keep].long()] = rows[keep].to(flat.device)


def read_fp8_ds_mla(cache: torch.Tensor, lora: int = LORA) -> torch.Tensor:
    """The float32 [slots, lora + rope] rows a fp8_ds_mla cache holds."""
    flat = cache.view(-1, cache.shape[-1])
    n = flat.shape[0]
    vals = flat[:, :lora].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, lora : lora + 4 * (lora // TILE)].contiguous().view(torch.float32)
    latent = (vals.view(n, lora // TILE, TILE) * scales[..., None]).view(n, lora)
    rope = flat[:, lora + 4 * (lora // TILE) :].contiguous().view(torch.bfloat16).float()
    return torch.cat([latent, rope], dim=1)


def attention_ref(q: torch.Tensor, rows: torch.Tensor, sel: torch.Tensor, scale: float):
    s = (q.float() @ rows[sel].T) * scale
    return s.softmax(-1) @ rows[sel][:, :LORA], torch.logsumexp(s, -1)


def main() -> None:
    from vllm.v1.attention.backends.mla import sparse_utils as su

    device = torch.device(sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu")
    vllm_writer = "--vllm-writer" in sys.argv
    result: dict[str, object] = {"device": str(device), "writer": "vllm" if vllm_writer else "torch"}
    row_bytes = su.fp8_ds_mla_row_bytes(LORA, ROPE)
    result["row_bytes"] = row_bytes

    gen = torch.Generator().manual_seed(0)
    blocks = 8
    nslots = blocks * PAGE
    # latent values of GLM-5's scale (kv_a_layernorm output, |x| ~ 1) with a
    # few outliers per row, so the per-tile scales differ
    kv_c = torch.randn(nslots, LORA, generator=gen)
    kv_c[torch.rand(nslots, LORA, generator=gen) < 0.01] *= 8.0
    kv_c = kv_c.to(torch.bfloat16)
    k_pe = torch.randn(nslots, ROPE, generator=gen).to(torch.bfloat16)
    slot_ids = torch.randperm(nslots, generator=gen)

    cache8 = torch.zeros(blocks, PAGE, row_bytes, dtype=torch.uint8)
    if vllm_writer:
        from vllm import _custom_ops as ops

        cache8 = cache8.to(device)
        ops.concat_and_cache_mla(
            kv_c.to(device), k_pe.to(device), cache8, slot_ids.to(device), "fp8_ds_mla",
            torch.ones(1, device=device),
        )
        mine = torch.zeros(blocks, PAGE, row_bytes, dtype=torch.uint8)
        write_fp8_ds_mla(kv_c, k_pe, mine, slot_ids)
        same = (cache8.cpu() == mine)
        result["writer_bytes_equal_fraction"] = float(same.float().mean())
        result["writer_scales_equal"] = bool(same[..., LORA : LORA + 16].all())
        result["writer_rope_equal"] = bool(same[..., LORA + 16 :].all())
        result["writer_max_abs_diff_vs_torch_reader"] = float(
            (read_fp8_ds_mla(cache8.cpu()) - read_fp8_ds_mla(mine)).abs().max()
        )
    else:
        write_fp8_ds_mla(kv_c, k_pe, cache8, slot_ids)
        cache8 = cache8.to(device)

    # bf16 cache of the same tokens at the same slots (0011's layout)
    cache16 = torch.zeros(blocks, PAGE, LORA + ROPE, dtype=torch.bfloat16)
    cache16.view(-1, LORA + ROPE)[slot_ids] = torch.cat([kv_c, k_pe], dim=1)
    cache16 = cache16.to(device)

    # round trip: the reader of the written rows against the input
    rows8 = read_fp8_ds_mla(cache8.cpu())
    truth = cache16.view(-1, LORA + ROPE).float().cpu()
    tile_max = truth[:, :LORA].view(nslots, LORA // TILE, TILE).abs().amax(-1)
    # e4m3: 3 mantissa bits, so a value is within 2^-4 of itself relative to
    # its own binade; bounded by the tile's largest magnitude x 2^-4
    err = (rows8[:, :LORA] - truth[:, :LORA]).view(nslots, LORA // TILE, TILE).abs().amax(-1)
    result["roundtrip_latent_max_err_over_tile_max"] = float((err / tile_max).max())
    result["roundtrip_rope_exact"] = bool(torch.equal(rows8[:, LORA:], truth[:, LORA:]))
    result["roundtrip_latent_rel_rms"] = float(
        (rows8[:, :LORA] - truth[:, :LORA]).pow(2).mean().sqrt() / truth[:, :LORA].pow(2).mean().sqrt()
    )

    ntok, topk = 5, 64
    q = (torch.randn(ntok, HEADS, LORA + ROPE, generator=gen) * 0.1).to(torch.bfloat16)
    slots = torch.randint(0, nslots, (ntok, topk), generator=gen, dtype=torch.int32)
    slots[1, 10:] = -1
    slots[3] = -1
    scale = (192 ** -0.5)  # GLM-5's softmax scale (qk_nope 192 + rope 64 -> 1/sqrt(256)) order
    q_d, slots_d = q.to(device), slots.to(device)
    kern_err = quant_err = lse_err = bf16_err = 0.0
    empty_ok = True
    for sms in (1, 64):
        out8, lse8 = su.sparse_mla(q_d, cache8, slots_d, scale, LORA, sms)
        out16, _ = su.sparse_mla(q_d, cache16, slots_d, scale, LORA, sms)
        out8, lse8, out16 = out8.float().cpu(), lse8.cpu(), out16.float().cpu()
        for t in range(ntok):
            sel = slots[t][slots[t] >= 0].long()
            if len(sel) == 0:
                empty_ok &= bool((out8[t] == 0).all() and torch.isinf(lse8[t]).all())
                continue
            o, lse = attention_ref(q[t], rows8, sel, scale)
            kern_err = max(kern_err, float((out8[t] - o).abs().max() / o.abs().max()))
            lse_err = max(lse_err, float((lse8[t] - lse).abs().max()))
            quant_err = max(quant_err, float((out8[t] - out16[t]).abs().max() / out16[t].abs().max()))
            o16, _ = attention_ref(q[t], truth, sel, scale)
            bf16_err = max(bf16_err, float((out16[t] - o16).abs().max() / o16.abs().max()))
    result["splits_used"] = [su.num_splits(ntok, 1, topk, s) for s in (1, 64)]
    result["fp8_kernel_vs_float32_dequant_rel_err"] = kern_err
    result["fp8_kernel_lse_abs_err"] = lse_err
    result["fp8_vs_bf16_cache_rel_err"] = quant_err
    result["bf16_kernel_vs_float32_rel_err"] = bf16_err
    result["empty_rows_zero"] = empty_ok
    # the backend's cache shape and the refusals of other layouts
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLASparseBackend

    result["cache_shape_fp8"] = list(TritonMLASparseBackend.get_kv_cache_shape(3, PAGE, 1, 576, "fp8_ds_mla"))
    result["cache_shape_bf16"] = list(TritonMLASparseBackend.get_kv_cache_shape(3, PAGE, 1, 576, "auto"))
    try:
        su.sparse_mla(q_d, cache8[..., :600].contiguous(), slots_d, scale, LORA, 1)
        result["wrong_row_bytes_refused"] = False
    except ValueError as exc:
        result["wrong_row_bytes_refused"] = "600 bytes, expected 656" in str(exc)
    try:
        # vLLM's plain fp8 layout (an e4m3 view of 576 values): not this kernel's
        su.sparse_mla(q_d, cache16.to(torch.float8_e4m3fn), slots_d, scale, LORA, 1)
        result["plain_fp8_cache_refused"] = False
    except ValueError as exc:
        result["plain_fp8_cache_refused"] = "expected torch.bfloat16 or uint8" in str(exc)
    if "--bench" in sys.argv and device.type == "cuda":
        result["bench"] = bench(su, device)
    print(json.dumps(result))


def bench(su, device: torch.device) -> list[dict[str, object]]:
    """sparse_mla's time per call at GLM-5's per-rank dims (TP 8: 8 heads, index_topk
    2048) over a 64k-token cache, bf16 against fp8_ds_mla rows: medians of 50 calls
    (CUDA events), and the bytes of the selected rows each call reads."""
    from vllm import _custom_ops as ops

    gen = torch.Generator(device=device).manual_seed(1)
    ntok, topk = 65536, 2048
    kv_c = torch.randn(ntok, LORA, device=device, generator=gen).to(torch.bfloat16)
    k_pe = torch.randn(ntok, ROPE, device=device, generator=gen).to(torch.bfloat16)
    slot_ids = torch.arange(ntok, device=device)
    c16 = torch.cat([kv_c, k_pe], dim=1).view(ntok // PAGE, PAGE, LORA + ROPE)
    c8 = torch.zeros(ntok // PAGE, PAGE, su.fp8_ds_mla_row_bytes(LORA, ROPE), dtype=torch.uint8, device=device)
    ops.concat_and_cache_mla(kv_c, k_pe, c8, slot_ids, "fp8_ds_mla", torch.ones(1, device=device))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for batch in (1, 16, 64):
        q = (torch.randn(batch, HEADS, LORA + ROPE, device=device, generator=gen) * 0.1).to(torch.bfloat16)
        slots = torch.randint(0, ntok, (batch, topk), device=device, generator=gen, dtype=torch.int32)
        row: dict[str, object] = {"batch": batch, "heads": HEADS, "topk": topk}
        for name, cache in (("bf16", c16), ("fp8", c8)):
            for _ in range(5):
                su.sparse_mla(q, cache, slots, 0.0625, LORA, sms)
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                su.sparse_mla(q, cache, slots, 0.0625, LORA, sms)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            med = sorted(times)[len(times) // 2]
            nbytes = batch * topk * cache.shape[-1] * cache.element_size()
            row[f"{name}_ms"] = round(med, 4)
            row[f"{name}_row_bytes_read"] = nbytes
            row[f"{name}_GBps"] = round(nbytes / med / 1e6, 1)
        row["fp8_over_bf16_time"] = round(float(row["fp8_ms"]) / float(row["bf16_ms"]), 3)  # type: ignore[arg-type]
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
