"""Patch 0011's Triton kernels and indexer path against float32 torch, on the CPU.

usage: TRITON_INTERPRET=1 python sparse_kernels_check.py [--fault off-by-one]
(prints one JSON object). Runs on an overlay (PYTHONPATH) with the patch set.

GLM-5's per-rank shapes (8 heads, kv_lora 512 + rope 64, indexer 32 heads x
128, page 64) on random data, with shuffled block tables:

* indexer_logits over the paged fp8 cache against float32 scores of the
  dequantized cache, for decode tokens and for prefill tokens of a chunk whose
  request has a cached prefix (context longer than the chunk);
* sparse_attn_indexer_triton (the op the model calls) fed the indexer metadata
  that vLLM's own build_prefill_chunk_metadata makes for a mixed batch, its
  top-k selection against the float32 top-k;
* sparse_mla against float32 softmax attention over the same selection, with
  one and with several splits, and rows with no selection.

--fault off-by-one: the contexts handed to the kernels are one longer (each
token also sees the next one): the checks must then fail.
"""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import torch

PAGE, D, H = 64, 128, 32
HEADS, LORA, ROPE = 8, 512, 64


def quant(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = k.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (k / scale[..., None]).to(torch.float8_e4m3fn), scale


def paged_cache(lens: list[int], gen: torch.Generator):
    blocks = [math.ceil(n / PAGE) for n in lens]
    nblocks = sum(blocks) + 2
    perm = torch.randperm(nblocks, generator=gen).to(torch.int32)
    bt = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    used = 0
    for r, nb in enumerate(blocks):
        bt[r, :nb] = perm[used : used + nb]
        used += nb
    cache = torch.zeros(nblocks, PAGE * (D + 4), dtype=torch.uint8)
    deq = []
    for r, n in enumerate(lens):
        kq, ks = quant(torch.randn(n, D, generator=gen))
        deq.append(kq.float() * ks[:, None])
        for p in range(n):
            b, o = int(bt[r, p // PAGE]), p % PAGE
            cache[b, o * D : (o + 1) * D] = kq[p].view(torch.uint8)
            cache[b, PAGE * D + 4 * o : PAGE * D + 4 * o + 4] = ks[p : p + 1].view(torch.uint8)
    return cache.view(nblocks, PAGE, D + 4), bt, deq


def ref_scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (w[:, None] * (q.float() @ k.T).relu()).sum(0)


def main() -> None:
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.backends.mla import sparse_utils as su
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
        DeepseekV32IndexerPrefillMetadata,
        build_prefill_chunk_metadata,
    )

    fault = "--fault" in sys.argv
    shift = 1 if fault else 0
    gen = torch.Generator().manual_seed(0)
    topk = 32
    # requests: two decodes (contexts 70 and 20), one prefill chunk of 40
    # tokens after a cached prefix of 60 (context 100), one fresh prefill of 50
    seq_lens = [70, 20, 100, 50]
    query_lens = [1, 1, 40, 50]
    cache, bt, deq = paged_cache(seq_lens, gen)
    ntok = sum(query_lens)
    q = torch.randn(ntok, H, D, generator=gen)
    q_fp8, qs = quant(q)
    w = torch.randn(ntok, H, generator=gen) * qs
    # per token: request and context length (position + 1)
    req_of, ctx_of = [], []
    for r, (s, n) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for i in range(n):
            req_of.append(r)
            ctx_of.append(s - n + i + 1)
    ref = [ref_scores(q_fp8[t], w[t], deq[req_of[t]][: ctx_of[t]]) for t in range(ntok)]
    result: dict[str, object] = {"fault": fault}

    # 1. the scores kernel alone
    width = max(seq_lens)
    logits = su.indexer_logits(
        q_fp8,
        w,
        cache,
        bt,
        torch.tensor(req_of, dtype=torch.int32),
        torch.tensor(ctx_of, dtype=torch.int32) + shift,
        width,
    )
    err, causal_ok = 0.0, True
    for t in range(ntok):
        c = ctx_of[t]
        err = max(err, float((logits[t, :c] - ref[t]).abs().max() / ref[t].abs().max()))
        causal_ok &= bool(torch.isinf(logits[t, c:]).all())
    result["logits_rel_err"] = err
    result["logits_causal"] = causal_ok

    # 2. the op, on the metadata vLLM's builder code makes (prefill chunks)
    # plus the per-step token metadata the patched builder adds (built by
    # token_request_and_context from query_start_loc and seq_lens, as the
    # builder does once per step); two padding tokens of a captured batch
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32) + shift
    chunk = build_prefill_chunk_metadata(2, 4, qsl, qsl, sl, sl, sl, bt, 1)
    assert chunk is not None
    npad = ntok + 2
    req_buf = torch.full((npad + 3,), 9, dtype=torch.int32)
    ctx_buf = torch.full((npad + 3,), 9, dtype=torch.int32)
    su.token_request_and_context(qsl, sl, 4, npad, req_buf, ctx_buf)
    want_ctx = [c + shift for c in ctx_of] + [0, 0]
    result["token_meta_ok"] = (
        req_buf[:ntok].tolist() == req_of
        and ctx_buf[:npad].tolist() == want_ctx
        and req_buf[npad:].tolist() == [9, 9, 9]
        and ctx_buf[npad:].tolist() == [0, 0, 0]
    )
    meta = DeepseekV32IndexerMetadata(
        seq_lens=sl,
        max_seq_len=int(sl.max()),
        slot_mapping=torch.zeros(npad, dtype=torch.int64),
        num_decodes=2,
        num_decode_tokens=2,
        num_prefills=2,
        num_prefill_tokens=ntok - 2,
        decode=DeepSeekV32IndexerDecodeMetadata(
            block_table=bt[:2],
            seq_lens=sl[:2].unsqueeze(-1),
            decode_lens=torch.ones(2, dtype=torch.int32),
            requires_padding=False,
            schedule_metadata=torch.empty(0),
        ),
        prefill=DeepseekV32IndexerPrefillMetadata(chunks=[chunk]),
        triton_tokens=su.TritonIndexerTokens(req_buf[:npad], ctx_buf[:npad], bt),
    )
    sai.get_forward_context = lambda: SimpleNamespace(attn_metadata={"layer.k_cache": meta})
    buf = torch.full((npad, topk), 7, dtype=torch.int32)
    qp, q8p, wp = (torch.cat([x, x[:2]]) for x in (q, q_fp8, w))
    sai.sparse_attn_indexer_triton(
        qp,
        "layer.k_cache",
        cache.view(-1, PAGE, D + 4),
        q8p,
        None,
        None,
        wp,
        128,
        "ue8m0",
        topk,
        D,
        4096,
        0,
        buf,
        True,
    )
    agree, shape_ok = 0, True
    for t in range(ntok):
        want = set(ref[t].topk(min(topk, ctx_of[t])).indices.tolist())
        got = buf[t].tolist()
        valid = [i for i in got if i >= 0]
        shape_ok &= len(valid) == min(topk, ctx_of[t]) and all(i < ctx_of[t] for i in valid)
        agree += len(want & set(valid))
    result["topk_agreement"] = agree / sum(min(topk, c) for c in ctx_of)
    result["topk_causal_and_counts"] = shape_ok
    result["padding_rows_empty"] = bool((buf[ntok:] == -1).all())
    result["topk_path_cpu"] = su.topk_path(torch.device("cpu"), topk)

    # 2b. indexer_topk alone (the torch path): against float32 top-k on rows
    # with -inf tails, and ties at the k-th place kept earliest-first
    lg = torch.randn(6, 300, generator=gen)
    lens = torch.tensor([300, 200, 31, 32, 1, 0], dtype=torch.int32) + shift
    for r, n in enumerate(lens.tolist()):
        lg[r, min(n, 300) :] = float("-inf")
    sel = torch.full((6, topk + 3), 5, dtype=torch.int32)
    su.indexer_topk(lg, topk, sel, lens)
    exact = True
    for r, n in enumerate(lens.tolist()):
        n = min(n, 300) - shift  # the true context
        want = set(lg[r, :n].topk(min(topk, n)).indices.tolist()) if n > 0 else set()
        got = [i for i in sel[r, :topk].tolist() if i >= 0]
        exact &= set(got) == want and len(got) == len(want)
    # the same rows without the -inf tail: the lengths alone bound the selection
    free = torch.randn(6, 300, generator=gen)
    free[:, :] = torch.where(torch.isinf(lg), free, lg)
    sel2 = torch.full((6, topk), 5, dtype=torch.int32)
    su.indexer_topk(free, topk, sel2, lens)
    exact &= torch.equal(sel2.sort(dim=1).values, sel[:, :topk].sort(dim=1).values)
    result["topk_exact_vs_float32"] = exact and bool((sel[:, topk:] == 5).all())
    tie = torch.zeros(3, 100)
    tie[1, 50:] = 1.0  # 50 above, the rest tied below: the 50 plus none
    tie[2, :] = torch.arange(100).float() % 4  # 25 each of 3, 2, 1, 0
    tsel = torch.empty(3, topk, dtype=torch.int32)
    su.indexer_topk(tie, topk, tsel, torch.full((3,), 100, dtype=torch.int32))
    threes = [i for i in range(100) if i % 4 == 3]
    twos = [i for i in range(100) if i % 4 == 2][: topk - 25]
    result["topk_ties_earliest"] = (
        tsel[0].tolist() == list(range(topk))
        and tsel[1].tolist() == list(range(50, 50 + topk))
        and tsel[2].tolist() == sorted(threes + twos)
    )

    # 3. sparse MLA over a selection
    nslots = 8 * PAGE
    kv = (torch.randn(8, PAGE, LORA + ROPE, generator=gen) * 0.5).to(torch.bfloat16)
    qq = (torch.randn(5, HEADS, LORA + ROPE, generator=gen) * 0.5).to(torch.bfloat16)
    slots = torch.randint(0, nslots, (5, 64), generator=gen, dtype=torch.int32)
    slots[1, 10:] = -1
    slots[3] = -1
    mla_err, empty_ok = 0.0, True
    flat = kv.view(-1, LORA + ROPE).float()
    for sms in (1, 64):
        out, lse = su.sparse_mla(qq, kv, slots, 0.0625, LORA, sms)
        for t in range(5):
            sel = slots[t][slots[t] >= 0].long()
            if len(sel) == 0:
                empty_ok &= bool((out[t] == 0).all() and torch.isinf(lse[t]).all())
                continue
            s = (qq[t].float() @ flat[sel].T) * 0.0625
            o = s.softmax(-1) @ flat[sel][:, :LORA]
            mla_err = max(mla_err, float((out[t].float() - o).abs().max() / o.abs().max()))
            mla_err = max(mla_err, float((lse[t] - torch.logsumexp(s, -1)).abs().max()))
    result["splits_used"] = [su.num_splits(5, 1, 64, s) for s in (1, 64)]
    result["sparse_mla_rel_err"] = mla_err
    result["empty_rows_zero"] = empty_ok
    print(json.dumps(result))


if __name__ == "__main__":
    main()
