"""Run 6, here: how often the indexer's k-th best score is tied, with vLLM's fp8 rounding of
the indexer q and k (the CPU reference, attention="sparse-fp8"), on the main fixture's
4096-token prompt (run 5b's first). A tie at the k-th place lets a top-k kernel keep either
of the tied positions: the torch path keeps the earliest, persistent_topk any of them.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/run6/ties6.py GGUF OUT.json
"""

import json
import sys
from pathlib import Path

import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
here = Path(__file__).resolve().parent
ids = json.loads((here.parent / "run5" / "b" / "prompts.json").read_text())[0]["ids"]
model = GlmDsaReference(gguf)
k = model.hp.index_topk
fwd = model.forward(ids, attention="sparse-fp8", keep_trace=True)
report = {"n_tokens": len(ids), "index_topk": k, "layers": []}
for il, tr in enumerate(fwd.layers):
    if tr.scores is None:
        continue
    s = tr.scores[k:]  # positions with more than k candidates
    kth = torch.topk(s, k, dim=1).values[:, -1:]
    above = (s > kth).sum(1)
    equal = (s == kth).sum(1)
    straddle = (above + equal) > k  # more tied positions than places left
    report["layers"].append(
        {
            "layer": il,
            "positions": int(s.shape[0]),
            "positions_with_kth_tie_straddling_k": int(straddle.sum()),
            "median_tied_at_kth": float(equal.float().median()),
            "max_tied_at_kth": int(equal.max()),
            "positions_with_kth_score_zero": int((kth == 0).sum()),
        }
    )
    print(json.dumps(report["layers"][-1]), flush=True)
out.write_text(json.dumps(report, indent=1) + "\n")
