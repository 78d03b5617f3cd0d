"""Run 5b, here: TRITON_MLA_SPARSE, vLLM's own FLASHMLA_SPARSE and the dense path on
the main fixture (index_topk 2048) at 4096 and 5120 tokens, against llama.cpp and the
CPU reference on the same GGUF. The servers returned their top-20 log-probs per
position (whole distributions of 5000 positions do not fit a response), so this
compares top-1 (argmax) agreement, and the mean |log-prob difference| over each
position's server top-20, at the positions at or after index_topk and before it.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/run5/compare5b.py \
         RESULTS_DIR GGUF_FIRST_SHARD OUT.json
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, log_softmax
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

results, gguf, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
prompts = json.loads((Path(__file__).resolve().parent / "b" / "prompts.json").read_text())
model = GlmDsaReference(gguf)
topk = model.hp.index_topk
servers = ["sparse", "flashmla-sparse", "dense"]
arrays = {s: np.load(results / f"{s}.npz") for s in servers}
meta = {s: json.loads((results / f"{s}.json").read_text()) for s in servers}


def compare(lp: np.ndarray, ref: torch.Tensor) -> dict[str, float]:
    """lp [P, V] (top-20 finite, rest -inf) against ref log-probs [P, V]."""
    r = ref.numpy()
    fin = np.isfinite(lp)
    top1 = float((np.where(fin, lp, -np.inf).argmax(-1) == r.argmax(-1)).mean())
    dlp = float(np.abs(np.where(fin, lp - r, 0)).sum() / fin.sum())
    return {"top1": round(top1, 4), "mean_abs_logprob_diff_top20": round(dlp, 4), "positions": int(lp.shape[0])}


report: dict[str, object] = {"gguf": gguf.name, "index_topk": topk, "prompts": []}
for k, p in enumerate(prompts):
    ids, n = p["ids"], len(p["ids"])
    oracles = {
        "llama.cpp": log_softmax(llama_cpp_logits(gguf, ids)[: n - 1].float()),
        "reference": log_softmax(model.forward(ids).logits[: n - 1]),
        "reference-dense": log_softmax(model.forward(ids, attention="dense").logits[: n - 1]),
    }
    rec: dict[str, object] = {"n_tokens": n, "servers": {}, "oracles": {}}
    for a in ("reference", "reference-dense"):
        lp_a = oracles[a].numpy()
        top20 = np.full_like(lp_a, -np.inf)
        idx = np.argsort(-lp_a, axis=-1)[:, :20]
        np.put_along_axis(top20, idx, np.take_along_axis(lp_a, idx, -1), -1)
        rec["oracles"][f"{a} vs llama.cpp"] = {
            ">= top-k": compare(top20[topk:], oracles["llama.cpp"][topk:]),
            "< top-k": compare(top20[:topk], oracles["llama.cpp"][:topk]),
        }
    for s in servers:
        if f"lp{k}" not in arrays[s]:
            rec["servers"][s] = {"error": str(meta[s]["prompts"][k])[:300]}
            continue
        lp = arrays[s][f"lp{k}"]
        row: dict[str, object] = {}
        for o, ol in oracles.items():
            row[f"vs {o}, >= top-k"] = compare(lp[topk:], ol[topk:])
            row[f"vs {o}, < top-k"] = compare(lp[:topk], ol[:topk])
        row["greedy"] = meta[s]["prompts"][k].get("greedy_ids")
        row["concurrent_vs_sequential_max_abs_logprob_diff"] = meta[s]["concurrent_vs_sequential_max_abs_logprob_diff"][
            k
        ]
        rec["servers"][s] = row
    g = {s: rec["servers"][s].get("greedy") for s in servers}
    rec["greedy_sparse_equals_flashmla"] = g["sparse"] == g["flashmla-sparse"]
    rec["greedy_sparse_equals_dense"] = g["sparse"] == g["dense"]
    report["prompts"].append(rec)
    print(json.dumps(rec)[:3000], flush=True)
out.write_text(json.dumps(report, indent=1) + "\n")
