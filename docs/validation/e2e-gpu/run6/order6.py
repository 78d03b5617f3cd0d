"""Run 6f, on the GPU machine: does persistent_topk return its positions in the same ORDER
from run to run? (topk_check6.py compares sorted sets.) The code run as an inline
`python3 -c` in the last device call of run 6, here as a file; output in
results/d/topk_order6.txt.

usage: PYTHONPATH=<vLLM site with _C> python3 order6.py
Per case: the same scores 5 times; rows longer than k whose set changed, whose order changed
(against the first run), and rows whose positions come out ascending.
"""

import torch
import vllm._C  # noqa: F401  (registers torch.ops._C)

d = "cuda"
k = 2048
for n, rows, w in (
    (4096, "prefill", 4096),
    (5120, "prefill", 5120),
    (16, "decode 16x64k", 70000),
    (1, "decode 1x8k", 8192),
):
    g = torch.Generator(device=d).manual_seed(3)
    if rows == "prefill":
        ctx = torch.arange(1, n + 1, dtype=torch.int32, device=d)
    else:
        ctx = torch.full((n,), w - 4464 if w == 70000 else 8000, dtype=torch.int32, device=d)
    scores = torch.randn(n, w, generator=g, device=d)
    outs = []
    for _ in range(5):
        o = torch.full((n, k), -1, dtype=torch.int32, device=d)
        ws = torch.zeros(1 << 20, dtype=torch.uint8, device=d)
        torch.ops._C.persistent_topk(scores, ctx, o, ws, k, w)
        torch.cuda.synchronize()
        outs.append(o)
    long = ctx > k
    set_changed = sum((torch.sort(x, 1).values != torch.sort(outs[0], 1).values).any(1).sum().item() for x in outs[1:])
    order_changed = sum((x != outs[0]).any(1)[long].sum().item() for x in outs[1:])
    asc = (outs[0][:, 1:] >= outs[0][:, :-1]).all(1)
    print(
        rows,
        n,
        "rows>k",
        long.sum().item(),
        "set changed",
        set_changed,
        "order changed (rows>k, 4 reruns)",
        order_changed,
        "ascending rows>k",
        asc[long].sum().item(),
        "ascending rows<=k",
        asc[~long].sum().item(),
        "of",
        (~long).sum().item(),
    )
