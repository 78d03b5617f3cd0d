"""Patch 0011's selection order, checked in Triton's CPU interpreter (end-to-end GPU run 6
found it): vLLM's persistent_topk returns the exact top-k set in another order on every
call (H100), and sparse_mla sums in selection order, so 0011 sorts each row
(sort_topk_rows) after persistent_topk unless GLM5_SPARSE_TOPK_SORT=0.

usage: TRITON_INTERPRET=1 PYTHONPATH=<patched site> python topk_order_check.py
(prints one JSON line; run with GLM5_SPARSE_TOPK_SORT=0 it shows what the sort fixes)

persistent_topk is a CUDA kernel of vLLM's _C, which these machines cannot run:
gpu_standin_persistent_topk below stands in for it at that boundary (the set the torch
path selects, each row in a fresh random order on every call, as the H100 showed in run 6:
`run6/results/d/topk_check6.json` in docs/validation/e2e-gpu/results.json). docs/validation/e2e-gpu/det
checks the real kernel on the GPU.
"""

from __future__ import annotations

import json
import os

import torch

INT32_MAX = 2**31 - 1
TOPK = 256
LORA, ROPE, HEADS = 512, 64, 8


def torch_sort_last(x: torch.Tensor) -> torch.Tensor:
    y = torch.sort(torch.where(x < 0, INT32_MAX, x), dim=1).values
    return torch.where(y == INT32_MAX, -1, y)


def main() -> None:
    from vllm.v1.attention.backends.mla import sparse_utils as su

    gen = torch.Generator().manual_seed(0)
    result: dict[str, object] = {"sort_env": os.environ.get("GLM5_SPARSE_TOPK_SORT"), "sort_on": su.SORT_TOPK}

    # 1. the row sort against torch.sort, -1 last: random distinct positions, padding,
    # a row of padding only, duplicates, other negatives, k not a power of two, k 2048
    cases = []
    x = torch.stack([torch.randperm(5000, generator=gen)[:TOPK] for _ in range(6)]).int()
    x[1, 100:] = -1
    x[2] = -1
    x[3, :7] = x[3, 7]  # duplicates (distinct in real selections; must not break the sort)
    x[4, ::3] = -5  # any negative is "none": -1, last
    x[5, :] = torch.arange(TOPK - 1, -1, -1, dtype=torch.int32)  # descending
    cases.append(x)
    cases.append(torch.randint(-1, 60, (3, 37), generator=gen, dtype=torch.int32))
    cases.append(torch.randperm(70000, generator=gen)[:2048].int()[None, :])
    sort_ok = {}
    for method in ("rank", "bitonic"):
        ok = True
        for c in cases:
            y = c.clone()
            su.sort_topk_rows(y, width=70000, method=method)  # in place
            ok &= torch.equal(y, torch_sort_last(c))
            # into a view with a row stride (topk_indices_buffer[:n, :k] of a wider buffer)
            wide = torch.full((c.shape[0], c.shape[1] + 8), 77, dtype=torch.int32)
            su.sort_topk_rows(c, wide[:, : c.shape[1]], 70000, method=method)
            ok &= torch.equal(wide[:, : c.shape[1]], torch_sort_last(c)) and bool((wide[:, -8:] == 77).all())
        sort_ok[method] = ok
    result["sort_equals_torch_sort"] = sort_ok

    # 2. indexer_topk on the persistent_topk path (the GPU op's stand-in) against the
    # torch path; rows longer than k, shorter (padding), of length 1 and 0
    lib = torch.library.Library("_C", "DEF")  # kept alive while the op is used
    lib.define(
        "persistent_topk(Tensor logits, Tensor lengths, Tensor(a!) output, Tensor(b!) workspace, "
        "int k, int max_seq_len) -> ()"
    )

    def gpu_standin_persistent_topk(
        logits: torch.Tensor, lengths: torch.Tensor, output: torch.Tensor, workspace: torch.Tensor, k: int, w: int
    ) -> None:
        forced, su.topk_path = su.topk_path, torch_topk_path
        try:
            su.indexer_topk(logits, k, output, lengths)  # the torch path: the exact set
        finally:
            su.topk_path = forced
        perm = torch.argsort(torch.rand(output.shape, generator=gen), dim=1)
        output.copy_(torch.gather(output, 1, perm))

    torch_topk_path = su.topk_path
    lib.impl("persistent_topk", gpu_standin_persistent_topk, "CPU")
    width = 700
    lens = torch.tensor([700, 650, 300, 257, 256, 100, 1, 0], dtype=torch.int32)
    rows = lens.shape[0]
    scores = torch.randn(rows, width, generator=gen)
    want = torch.full((rows, TOPK), 9, dtype=torch.int32)
    su.indexer_topk(scores, TOPK, want, lens)  # the torch path (CPU): ascending, -1 last
    again = torch.full_like(want, 9)
    su.indexer_topk(scores, TOPK, again, lens)
    result["torch_path_repeatable_ascending"] = bool(
        torch.equal(want, again) and torch.equal(want, torch_sort_last(want))
    )

    su.topk_path = lambda device, topk: "persistent_topk"
    rank_rows = su.SORT_RANK_MAX_ROWS
    try:
        sels = []
        for call in range(4):
            # calls 0-1: the rank kernel; 2-3: the bitonic one, into a view of a wider
            # buffer (call 2) and in place in a contiguous one (call 3)
            su.SORT_RANK_MAX_ROWS = rows if call < 2 else 0
            buf = torch.full((rows + 2, TOPK + (0 if call == 3 else 4)), 9, dtype=torch.int32)
            su.indexer_topk(scores, TOPK, buf[:rows], lens, torch.empty(16, dtype=torch.uint8))
            assert bool((buf[:, TOPK:] == 9).all()) and bool((buf[rows:] == 9).all())
            sels.append(buf[:rows, :TOPK].clone())
    finally:
        su.topk_path = torch_topk_path
        su.SORT_RANK_MAX_ROWS = rank_rows
    result["persistent_path_set_exact"] = all(torch.equal(torch_sort_last(s), want) for s in sels)
    result["persistent_path_equals_torch_path"] = all(torch.equal(s, want) for s in sels)
    result["persistent_path_calls_identical"] = all(torch.equal(s, sels[0]) for s in sels)

    # 3. sparse MLA over those selections (global slots: request r's cache rows from
    # r * width), one split and merged splits: bitwise the same output on every call?
    kv = (torch.randn(rows * width, 1, LORA + ROPE, generator=gen) * 0.5).to(torch.bfloat16)
    q = (torch.randn(rows, HEADS, LORA + ROPE, generator=gen) * 0.5).to(torch.bfloat16)
    base = (torch.arange(rows, dtype=torch.int32) * width)[:, None]
    identical, differs = {}, {}
    for sms in (1, 64):
        outs = []
        for s in sels:
            slots = torch.where(s >= 0, s + base, -1)
            outs.append(su.sparse_mla(q, kv, slots, 0.0625, LORA, sms))
        same = [torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1]) for o, lse in outs]
        identical[str(su.num_splits(rows, 1, TOPK, sms))] = all(same)
        differs[str(su.num_splits(rows, 1, TOPK, sms))] = max(
            float((o.float() - outs[0][0].float()).abs().max()) for o, _ in outs
        )
        # the empty row (context 0) stays empty whatever the order
        identical[f"empty_row_{sms}"] = all(bool((o[rows - 1] == 0).all()) for o, _ in outs)
    result["mla_bitwise_identical"] = identical
    result["mla_max_abs_diff"] = differs
    print(json.dumps(result))


if __name__ == "__main__":
    main()
