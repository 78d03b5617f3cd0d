"""Run 6a, here: run 5's end-to-end comparison (compare5.py, unchanged in what it
computes) for the servers of a/servers.yml: the 0011 of issue 23 with CUDA graphs and
eager, and the same with the off-by-one selection fault. The oracles are cached.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/run6/compare6.py \
         RESULTS_DIR GGUF OUT.json [ORACLE_CACHE.pt]
Per server and prompt: top-1 agreement and mean KL(server || oracle) over the
positions at or after index_topk (where sparse and dense attention differ) and
before it; greedy continuations against the sparse server's. Oracles: llama.cpp,
the reference (float32 indexer), the reference with vLLM's fp8 indexer rounding
(attention="sparse-fp8"), the dense reference.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, agreement
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

results, gguf, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
here = Path(__file__).resolve().parent
prompts = json.loads((here.parent / "run5" / "prompts.json").read_text())
cache = Path(sys.argv[4]) if len(sys.argv) > 4 else None
model = GlmDsaReference(gguf)
topk = model.hp.index_topk
servers = ["sparse-graphs", "sparse", "sparse-fault"]
oracles: dict[str, list[torch.Tensor]] = {
    "llama.cpp": [],
    "reference": [],
    "reference-fp8-indexer": [],
    "reference-dense": [],
}
if cache is not None and cache.exists():
    oracles = torch.load(cache)
else:
    for p in prompts:
        ids = p["ids"]
        oracles["llama.cpp"].append(llama_cpp_logits(gguf, ids))
        oracles["reference"].append(model.forward(ids).logits)
        oracles["reference-fp8-indexer"].append(model.forward(ids, attention="sparse-fp8").logits)
        oracles["reference-dense"].append(model.forward(ids, attention="dense").logits)
    oracles["reference-off-by-one"] = [model.forward(p["ids"], selection_fault="shift").logits for p in prompts]
    if cache is not None:
        torch.save(oracles, cache)
shifted = oracles.pop("reference-off-by-one")


def fmt(a: object) -> dict[str, float]:
    d = a.as_dict()  # type: ignore[attr-defined]
    return {"top1": round(d["top1"], 4), "kl_mean": round(d["kl_mean"], 5), "n": d["positions"]}


report: dict[str, object] = {"gguf": gguf.name, "index_topk": topk, "servers": {}, "oracles": {}}
# the oracles against each other (llama.cpp vs reference, and dense vs llama.cpp)
for name in ("reference", "reference-fp8-indexer", "reference-dense"):
    report["oracles"][f"{name} vs llama.cpp"] = [
        fmt(agreement(oracles[name][k], oracles["llama.cpp"][k], start=topk)) if len(p["ids"]) > topk else None
        for k, p in enumerate(prompts)
    ]
sparse_greedy = None
for s in servers:
    npz = results / f"{s}.npz"
    meta = json.loads((results / f"{s}.json").read_text())
    arrays = np.load(npz) if npz.stat().st_size > 100 else {}
    rows = []
    for k, p in enumerate(prompts):
        n = len(p["ids"])
        if f"lp{k}" not in arrays:
            rows.append({"error": str(meta["prompts"][k].get("error", "no result"))[:300]})
            continue
        # server row i is the distribution of token i+1 (positions 1..n-1)
        lp = torch.from_numpy(arrays[f"lp{k}"])
        row: dict[str, object] = {"n_tokens": n}
        for oname, ologits in oracles.items():
            o = ologits[k][: n - 1]
            # agreement() takes logits; log-probs are logits up to a constant per row
            got = torch.where(torch.isfinite(lp), lp, torch.full_like(lp, -1e30))
            if n - 1 > topk:
                row[f"vs {oname}, positions >= top-k"] = fmt(agreement(got, o, start=topk))
            row[f"vs {oname}, positions < top-k"] = fmt(agreement(got[: min(topk, n - 1)], o[: min(topk, n - 1)]))
        row["greedy"] = meta["prompts"][k].get("greedy_ids")
        rows.append(row)
    report["servers"][s] = {
        "prompts": rows,
        "concurrent_vs_sequential_max_abs_logprob_diff": meta.get("concurrent_vs_sequential_max_abs_logprob_diff"),
    }
sg = [r.get("greedy") for r in report["servers"]["sparse"]["prompts"]]  # the eager server
for s in servers:
    report["servers"][s]["greedy_equal_to_sparse"] = [
        (r.get("greedy") == g) if r.get("greedy") is not None else None
        for r, g in zip(report["servers"][s]["prompts"], sg, strict=True)
    ]
# The end-to-end verdict: a server serves GLM-5's sparse attention when, at the positions
# past index_topk of every long prompt, KL(llama.cpp || server) stays within 2x the spread
# of the fp8-indexer reference (the worst a correct vLLM implementation shows). The
# reference with an off-by-one selection (selection_fault="shift") and the dense
# reference go through the same check: it must fail them, or it could not catch a fault.
spread = max(d["kl_mean"] for d in report["oracles"]["reference-fp8-indexer vs llama.cpp"] if d)
report["verdict_kl_max"] = round(2 * spread, 5)


def verdict(kls: list[float]) -> str:
    return "PASS" if kls and max(kls) <= 2 * spread else "FAIL"


long = [k for k, p in enumerate(prompts) if len(p["ids"]) - 1 > topk]
report["verdicts"] = {}
for s in servers:
    rows = report["servers"][s]["prompts"]
    if any("error" in rows[k] for k in long):
        report["verdicts"][s] = "NO RESULT (did not serve)"
        continue
    report["verdicts"][s] = verdict([rows[k]["vs llama.cpp, positions >= top-k"]["kl_mean"] for k in long])
for name, rows in (("reference with off-by-one selection", shifted), ("dense reference", oracles["reference-dense"])):
    kls = [
        agreement(
            rows[k][: len(prompts[k]["ids"]) - 1], oracles["llama.cpp"][k][: len(prompts[k]["ids"]) - 1], start=topk
        ).kl_mean
        for k in long
    ]
    report["verdicts"][name] = verdict(kls) + f" (KL {', '.join(f'{x:.3f}' for x in kls)})"
out.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
