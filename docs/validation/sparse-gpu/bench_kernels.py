"""GLM-5 sparse attention kernels (patch 0011, in sparse_utils.py) on a GPU, at GLM-5's real dims.

Run on the GPU validation machine by run.sh. Per context length (4k, 16k, 64k)
and batch size, on random data of GLM-5's per-rank attention shapes (8 heads at
TP 8, kv_lora 512, rope 64, index_n_heads 32, index_head_dim 128, index_topk
2048, page size 64):

* agreement of each kernel with a float32 torch computation of the same math on
  the same (dequantized fp8 / bf16) inputs: indexer scores, the top-k selection
  (overlap with the float32 top-k), MLA over the selection;
* the sparse output against dense MLA over the whole context (vLLM's own Triton
  MLA decode kernel), which must differ past index_topk tokens;
* time of one layer's decode attention step under CUDA graph replay: sparse
  (indexer scores + top-k + slot lookup + sparse MLA) against dense (vLLM's
  decode_attention_fwd with the split count TritonMLAImpl picks).

vLLM's triton_decode_attention.py is loaded from its wheel's file with two
stand-in modules for the two names it imports from vLLM (current_platform.is_rocm
and the triton re-export); nothing else of vLLM is needed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch
import triton

HEADS, KV_LORA, ROPE = 8, 512, 64
IDX_HEADS, IDX_DIM, TOPK, PAGE = 32, 128, 2048, 64
SCALE = (192 + 64) ** -0.5


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dense_module(path: Path) -> types.ModuleType:
    plat = types.ModuleType("vllm.platforms")
    plat.current_platform = types.SimpleNamespace(is_rocm=lambda: False)  # type: ignore[attr-defined]
    tu = types.ModuleType("vllm.triton_utils")
    tu.tl = triton.language  # type: ignore[attr-defined]
    tu.triton = triton  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.platforms"] = plat
    sys.modules["vllm.triton_utils"] = tu
    return load(path, "vllm_triton_decode_attention")


def quant_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = k.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (k / scale[..., None]).to(torch.float8_e4m3fn), scale


def build(batch: int, ctx: int, dev: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    blocks_per = math.ceil(ctx / PAGE)
    nblocks = batch * blocks_per
    bt = torch.randperm(nblocks, generator=gen, device="cpu").to(dev, torch.int32).view(batch, blocks_per)
    # indexer cache: [nblocks, PAGE, D+4] bytes (per block: PAGE*D values, PAGE fp32 scales)
    k = torch.randn(nblocks, PAGE, IDX_DIM, generator=gen, device="cpu").to(dev)
    kq, ks = quant_rows(k)
    idx_cache = torch.empty(nblocks, PAGE * (IDX_DIM + 4), dtype=torch.uint8, device=dev)
    idx_cache[:, : PAGE * IDX_DIM] = kq.view(torch.uint8).reshape(nblocks, -1)
    idx_cache[:, PAGE * IDX_DIM :] = ks.contiguous().view(torch.uint8).reshape(nblocks, -1)
    idx_cache = idx_cache.view(nblocks, PAGE, IDX_DIM + 4)
    k_deq = kq.float() * ks[..., None]  # [nblocks, PAGE, D]
    mla_cache = (torch.randn(nblocks, PAGE, KV_LORA + ROPE, generator=gen, device="cpu") * 0.5).to(dev, torch.bfloat16)
    q_idx = torch.randn(batch, IDX_HEADS, IDX_DIM, generator=gen, device="cpu").to(dev)
    qq, qs = quant_rows(q_idx)
    w = torch.randn(batch, IDX_HEADS, generator=gen, device="cpu").to(dev) * qs * IDX_DIM**-0.5 * IDX_HEADS**-0.5
    q = (torch.randn(batch, HEADS, KV_LORA + ROPE, generator=gen, device="cpu") * 0.5).to(dev, torch.bfloat16)
    return bt, idx_cache, k_deq, mla_cache, qq, w, q


def positions_to_slots(bt: torch.Tensor, rows: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    valid = local >= 0
    lc = local.clamp(min=0).long()
    blk = bt.long()[rows.long()[:, None], lc // PAGE]
    return torch.where(valid, blk * PAGE + lc % PAGE, -1).to(torch.int32)


def graph_time(fn: Callable[[], torch.Tensor], reps: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    # the graph must hold the work: poison its output, replay, expect it rewritten
    result.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    if not torch.isfinite(result).all():
        raise RuntimeError("graph replay did not rewrite its output: capture missed the kernels")
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[len(times) // 2]


def one_run(kernels: types.ModuleType, dense: types.ModuleType, ctx: int, batch: int, gen: torch.Generator) -> dict:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bt, idx_cache, k_deq, mla_cache, qq, w, q = build(batch, ctx, dev, gen)
    rows = torch.arange(batch, dtype=torch.int32, device=dev)
    ctx_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    logits = torch.empty(batch, ctx, dtype=torch.float32, device=dev)
    sel = torch.empty(batch, TOPK, dtype=torch.int32, device=dev)

    def sparse_step() -> torch.Tensor:
        kernels.indexer_logits(qq, w, idx_cache, bt, rows, ctx_lens, ctx, out=logits)
        kernels.indexer_topk(logits, TOPK, sel)
        slots = positions_to_slots(bt, rows, sel)
        return kernels.sparse_mla(q, mla_cache, slots, SCALE, KV_LORA, sms)[0]

    o_sparse = sparse_step()
    torch.cuda.synchronize()
    # float32 reference of the same math
    kflat = k_deq.view(-1, IDX_DIM)
    pos_slots = positions_to_slots(bt, rows, torch.arange(ctx, device=dev, dtype=torch.int32).expand(batch, ctx))
    ref_logits = torch.stack(
        [(w[b][:, None] * (qq[b].float() @ kflat[pos_slots[b].long()].T).relu()).sum(0) for b in range(batch)]
    )
    fin = torch.isfinite(ref_logits)
    logit_err = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
    ref_top = ref_logits.topk(TOPK, dim=1).indices
    overlap = sum(len(set(sel[b].tolist()) & set(ref_top[b].tolist())) for b in range(batch)) / (batch * TOPK)
    kv = mla_cache.view(-1, KV_LORA + ROPE).float()
    slots = positions_to_slots(bt, rows, sel)
    attn_err, dense_diff = 0.0, 0.0
    o_dense = torch.zeros(batch, HEADS, KV_LORA, dtype=torch.bfloat16, device=dev)
    lse_dense = torch.zeros(batch, HEADS, dtype=torch.bfloat16, device=dev)
    splits = min(triton.next_power_of_2(max(1, ctx // 512)), 2 * sms)
    attn_logits = torch.empty(batch, HEADS, splits, KV_LORA + 1, dtype=torch.float32, device=dev)
    cache4 = mla_cache.unsqueeze(2)
    one = torch.ones((), dtype=torch.float32, device=dev)

    def dense_step() -> torch.Tensor:
        dense.decode_attention_fwd(
            q,
            cache4,
            cache4[..., :KV_LORA],
            o_dense,
            lse_dense,
            bt,
            ctx_lens,
            attn_logits,
            splits,
            SCALE,
            PAGE,
            k_scale=one,
            v_scale=one,
            is_mla=True,
        )
        return o_dense

    dense_step()
    torch.cuda.synchronize()
    for b in range(batch):
        kk = kv[slots[b].long()]
        s = (q[b].float() @ kk.T) * SCALE
        ref = s.softmax(-1) @ kk[:, :KV_LORA]
        attn_err = max(attn_err, ((o_sparse[b].float() - ref).abs().max() / ref.abs().max()).item())
        dense_diff = max(dense_diff, ((o_sparse[b].float() - o_dense[b].float()).abs().max() / ref.abs().max()).item())
    # dense kernel against float32 dense (so the difference above is the selection, not the kernel)
    kk = kv[pos_slots[0].long()]
    ref_dense = ((q[0].float() @ kk.T) * SCALE).softmax(-1) @ kk[:, :KV_LORA]
    dense_err = ((o_dense[0].float() - ref_dense).abs().max() / ref_dense.abs().max()).item()
    slots_fixed = positions_to_slots(bt, rows, sel)
    t_logits = graph_time(lambda: kernels.indexer_logits(qq, w, idx_cache, bt, rows, ctx_lens, ctx, out=logits))
    t_topk = graph_time(lambda: kernels.indexer_topk(logits, TOPK, sel).float())
    t_mla = graph_time(lambda: kernels.sparse_mla(q, mla_cache, slots_fixed, SCALE, KV_LORA, sms)[0])
    t_sparse = graph_time(sparse_step)
    t_dense = graph_time(dense_step)
    run = {
        "ctx": ctx,
        "batch": batch,
        "indexer_logits_rel_err": logit_err,
        "topk_overlap_with_fp32": overlap,
        "sparse_mla_rel_err": attn_err,
        "dense_kernel_rel_err": dense_err,
        "sparse_vs_dense_rel_diff": dense_diff,
        "all_finite": bool(fin.all().item()),
        "ms_sparse": t_sparse,
        "ms_dense": t_dense,
        "ms_sparse_parts": {
            "indexer_logits": t_logits,
            "topk": t_topk,
            "sparse_mla": t_mla,
        },
        "dense_over_sparse": t_dense / t_sparse,
        "tok_s_sparse_one_layer": batch / t_sparse * 1e3,
        "tok_s_dense_one_layer": batch / t_dense * 1e3,
    }
    return run


def main() -> None:
    dense = dense_module(Path(sys.argv[2]))
    # patch 0011's kernels, from the patched tree's sparse_utils.py
    kernels = load(Path(sys.argv[1]), "sparse_utils")
    out_path = Path(sys.argv[3])
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    results = {
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "runs": [],
    }
    for ctx in (4096, 16384, 65536):
        for batch in (1, 16):
            run = one_run(kernels, dense, ctx, batch, gen)
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
            torch.cuda.empty_cache()
    out_path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
