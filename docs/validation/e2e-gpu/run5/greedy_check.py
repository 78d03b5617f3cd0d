"""Run 5, here: the decode phase of each server against the oracles. Each server's 16
greedy tokens per prompt were chosen by its decode steps (CUDA graphs on sparse-graphs);
this counts how often the token is the argmax of the reference (sparse), the dense
reference and llama.cpp on the same sequence.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/run5/greedy_check.py \
         RESULTS_DIR GGUF OUT.json
"""

import json
import sys
from pathlib import Path

import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

res = Path(sys.argv[1])
gguf = Path(sys.argv[2])
prompts = json.loads(Path("docs/validation/e2e-gpu/run5/prompts.json").read_text())
m = GlmDsaReference(gguf)
out = {}
for s in ["sparse", "sparse-chunked", "sparse-graphs", "dense"]:
    meta = json.loads((res / f"{s}.json").read_text())
    tot = {"reference": 0, "reference-dense": 0, "llama.cpp": 0}
    n = 0
    for k, p in enumerate(prompts):
        g = meta["prompts"][k].get("greedy_ids")
        ids = p["ids"] + g
        L = len(p["ids"])
        logits = {
            "reference": m.forward(ids).logits,
            "reference-dense": m.forward(ids, attention="dense").logits,
            "llama.cpp": llama_cpp_logits(gguf, ids),
        }
        for name, lg in logits.items():
            # position L-1+j predicts generated token j
            pred = lg[L - 1 : L - 1 + len(g)].argmax(-1)
            tot[name] += int((pred == torch.tensor(g)).sum())
        n += len(g)
    out[s] = {k: round(v / n, 3) for k, v in tot.items()} | {"decode_steps": n}
    print(s, out[s], flush=True)
Path(sys.argv[3]).write_text(json.dumps(out, indent=1) + "\n")
