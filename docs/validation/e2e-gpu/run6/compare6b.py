"""Run 6b, here: the servers of b/servers.yml (the main fixture, index_topk 2048) on the
4096- and 5120-token prompts of run 5b, against llama.cpp and the CPU reference on the same
GGUF, as compare5b.py (top-20 log-probs per position: top-1 agreement and mean |log-prob
difference| over each position's server top-20, positions >= index_topk and before), for
the sequential requests and for the same prompts sent together (query5.py's concurrent
arrays), and the servers against each other.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/run6/compare6b.py \
         RESULTS_DIR GGUF OUT.json [ORACLE_CACHE.pt] [SERVER ...]
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, log_softmax
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

results, gguf, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
cache = Path(sys.argv[4]) if len(sys.argv) > 4 else None
servers = sys.argv[5:] or ["sparse-new", "sparse-old"]
here = Path(__file__).resolve().parent
prompts = json.loads((here.parent / "run5" / "b" / "prompts.json").read_text())
model = GlmDsaReference(gguf)
topk = model.hp.index_topk
arrays = {s: np.load(results / f"{s}.npz") for s in servers}
meta = {s: json.loads((results / f"{s}.json").read_text()) for s in servers}

if cache is not None and cache.exists():
    oracles_all = torch.load(cache)
else:
    oracles_all = []
    for p in prompts:
        ids, n = p["ids"], len(p["ids"])
        oracles_all.append(
            {
                "llama.cpp": log_softmax(llama_cpp_logits(gguf, ids)[: n - 1].float()),
                "reference": log_softmax(model.forward(ids).logits[: n - 1]),
                "reference-dense": log_softmax(model.forward(ids, attention="dense").logits[: n - 1]),
            }
        )
    if cache is not None:
        torch.save(oracles_all, cache)


def compare(lp: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """lp [P, V] (top-20 finite, rest -inf) against ref log-probs [P, V] (whole, or top-20)."""
    fin = np.isfinite(lp)
    top1 = float((np.where(fin, lp, -np.inf).argmax(-1) == np.where(np.isfinite(ref), ref, -np.inf).argmax(-1)).mean())
    both = fin & np.isfinite(ref)
    dlp = float(np.abs(np.where(both, lp - np.where(both, ref, 0), 0)).sum() / max(1, both.sum()))
    return {"top1": round(top1, 4), "mean_abs_logprob_diff_top20": round(dlp, 4), "positions": int(lp.shape[0])}


def split(lp: np.ndarray, ref: np.ndarray) -> dict[str, object]:
    return {">= top-k": compare(lp[topk:], ref[topk:]), "< top-k": compare(lp[:topk], ref[:topk])}


report: dict[str, object] = {"gguf": gguf.name, "index_topk": topk, "prompts": []}
for k, p in enumerate(prompts):
    n = len(p["ids"])
    oracles = {name: t.numpy() for name, t in oracles_all[k].items()}
    rec: dict[str, object] = {"n_tokens": n, "servers": {}}
    for s in servers:
        if f"lp{k}" not in arrays[s]:
            rec["servers"][s] = {"error": str(meta[s]["prompts"][k])[:300]}
            continue
        row: dict[str, object] = {}
        for kind in ("lp", "concurrent"):
            lp = arrays[s].get(f"{kind}{k}")
            if lp is None:
                continue
            for o, ol in oracles.items():
                row[f"{'sequential' if kind == 'lp' else 'together'} vs {o}"] = split(lp, ol)
        if f"concurrent{k}" in arrays[s]:
            row["sequential vs together"] = split(arrays[s][f"lp{k}"], arrays[s][f"concurrent{k}"])
        row["greedy"] = meta[s]["prompts"][k].get("greedy_ids")
        row["concurrent_vs_sequential_max_abs_logprob_diff"] = meta[s]["concurrent_vs_sequential_max_abs_logprob_diff"][
            k
        ]
        rec["servers"][s] = row
    for i, a in enumerate(servers):
        for b in servers[i + 1 :]:
            if f"lp{k}" in arrays[a] and f"lp{k}" in arrays[b]:
                rec[f"{a} vs {b}"] = split(arrays[a][f"lp{k}"], arrays[b][f"lp{k}"])
                ga, gb = rec["servers"][a].get("greedy"), rec["servers"][b].get("greedy")  # type: ignore[union-attr]
                rec[f"{a} vs {b} greedy common prefix"] = next(
                    (i for i, (x, y) in enumerate(zip(ga or [], gb or [], strict=False)) if x != y), len(ga or [])
                )
    report["prompts"].append(rec)
    print(json.dumps(rec)[:4000], flush=True)
out.write_text(json.dumps(report, indent=1) + "\n")
