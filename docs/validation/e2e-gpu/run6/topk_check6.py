"""Run 6d, on the GPU machine: vLLM's torch.ops._C.persistent_topk (what 0011 calls on CUDA
for top-k 512/1024/2048) at the row counts 0011 gives it. vLLM itself calls it at decode only
(one row per request); 0011 also calls it for prefill, with one row per prompt token.

usage: PYTHONPATH=<patched vLLM site> python3 topk_check6.py OUT.json
Per case: fp32 scores [T, W] (seeded normal; each row's length ctx), k, the workspace size.
A row is valid when its output holds min(k, ctx) distinct positions < ctx (the rest -1) and
none of them scores below the row's k-th best score (ties allowed). Each case runs 3 times:
rows whose output changed between runs are counted as well.
"""

import json
import os
import sys
from pathlib import Path

import torch
import vllm._C  # noqa: F401  (registers torch.ops._C)

dev = torch.device("cuda")
out_path = sys.argv[1]
results = []


def check(
    name: str, ctx: torch.Tensor, width: int, k: int, ws_bytes: int, seed: int = 0, ws_fill: str = "zero"
) -> None:
    g = torch.Generator(device=dev).manual_seed(seed)
    rows = ctx.numel()
    logits = torch.randn(rows, width, generator=g, device=dev, dtype=torch.float32)
    cols = torch.arange(width, device=dev)
    masked = logits.masked_fill(cols[None, :] >= ctx[:, None], float("-inf"))
    kk = min(k, width)
    kth = torch.topk(masked, kk, dim=1).values[:, -1]  # k-th best (-inf where ctx < k)
    outs = []
    for _ in range(3):
        dst = torch.full((rows, k), -7, dtype=torch.int32, device=dev)
        # the workspace as 0011 gets it: vLLM's workspace manager's buffer, which other ops
        # (e.g. the fused MoE) also use, so it holds what they left; here zeros, or not
        if ws_fill == "zero":
            ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=dev)
        elif ws_fill == "ff":
            ws = torch.full((ws_bytes,), 255, dtype=torch.uint8, device=dev)
        else:
            ws = torch.randint(0, 256, (ws_bytes,), dtype=torch.uint8, device=dev)
        torch.ops._C.persistent_topk(logits, ctx, dst, ws, k, width)
        torch.cuda.synchronize()
        outs.append(dst)
    dst = outs[0]
    want = torch.clamp(ctx, max=k)
    sel = dst >= 0
    n_sel = sel.sum(1)
    in_range = ((dst < ctx[:, None]) | ~sel).all(1)
    srt = torch.sort(torch.where(sel, dst, -1 - torch.arange(k, device=dev)[None, :]), dim=1).values
    distinct = (srt[:, 1:] != srt[:, :-1]).all(1)
    safe = torch.where(sel, dst, 0).long()
    score = torch.gather(logits, 1, safe)
    low = (sel & (score < kth[:, None]) & (ctx[:, None] > k)).any(1)
    unwritten = dst.eq(-7).any(1)  # slots the kernel left as they were (0011 sets -1 first)
    valid = (n_sel == want) & in_range & distinct & ~low
    changed = torch.zeros(rows, dtype=torch.bool, device=dev)
    for o in outs[1:]:
        changed |= (torch.sort(o, 1).values != torch.sort(outs[0], 1).values).any(1)
    bad = (~valid).nonzero().flatten()
    rec = {
        "case": name,
        "workspace_fill": ws_fill,
        "rows": rows,
        "width": width,
        "k": k,
        "workspace_bytes": ws_bytes,
        "ctx_min": int(ctx.min()),
        "ctx_max": int(ctx.max()),
        "invalid_rows": int((~valid).sum()),
        "rows_changed_between_runs": int(changed.sum()),
        "wrong_count_rows": int((n_sel != want).sum()),
        "rows_with_unwritten_slots": int(unwritten.sum()),
        "below_kth_rows": int(low.sum()),
        "first_invalid": [int(x) for x in bad[:5]],
        "first_invalid_ctx": [int(ctx[x]) for x in bad[:5]],
    }
    results.append(rec)
    print(json.dumps(rec), flush=True)


MB = 1024 * 1024
if os.environ.get("WS_FILL_ONLY"):
    # run 6e: the workspace's earlier contents (all the other cases zero it)
    for fill in ("zero", "ff", "random"):
        for n in (4096, 5120):
            prefill_ctx = torch.arange(1, n + 1, dtype=torch.int32, device=dev)
            check(f"prefill {n}", prefill_ctx, n, 2048, MB, ws_fill=fill)
        check("16 rows > k", torch.full((16,), 6000, dtype=torch.int32, device=dev), 8192, 2048, MB, ws_fill=fill)
        check("decode 16 x 64k", torch.full((16,), 65536, dtype=torch.int32, device=dev), 70000, 2048, MB, ws_fill=fill)
    Path(out_path).write_text(json.dumps(results, indent=1))
    sys.exit(0)
for k in (2048,):
    for ws in (MB, 256 * MB):
        # prefill of one prompt: row i is token i (ctx i + 1), as 0011 scores a prompt
        for n in (4096, 5120):
            check(f"prefill {n}", torch.arange(1, n + 1, dtype=torch.int32, device=dev), n, k, ws)
        # rows all longer than k, how many rows before it breaks
        for rows in (1, 16, 64, 128, 256, 512, 1024, 2048):
            gen = torch.Generator().manual_seed(rows)
            ctx = torch.randint(k + 1, 8192, (rows,), generator=gen, dtype=torch.int32).to(dev)
            check(f"{rows} rows > k", ctx, 8192, k, ws)
    # decode as vLLM calls it: a few rows, long contexts, width max_model_len-like
    check("decode 16 x 64k", torch.full((16,), 65536, dtype=torch.int32, device=dev), 70000, k, MB)
Path(out_path).write_text(json.dumps(results, indent=1))
