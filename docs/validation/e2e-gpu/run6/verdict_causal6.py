"""Run 6, here: run 5's end-to-end verdict applied to the CPU reference with the fault the
served run-6 fault injects (selection_fault="causal": each token's indexer also sees the next
token), beside the "shift" fault the verdict was shown to catch, on the topk32 prompts.

usage: PYTHONPATH=src:<llama.cpp bindings> .venv-ml/bin/python \
         docs/validation/e2e-gpu/run6/verdict_causal6.py GGUF ORACLE_CACHE.pt VERDICT_KL_MAX OUT.json
(ORACLE_CACHE.pt: compare6.py's cache, holding llama.cpp's logits of the prompts)
"""

import json
import sys
from pathlib import Path

import torch

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, agreement

gguf, cache, bound, out = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
prompts = json.loads((Path(__file__).resolve().parent.parent / "run5" / "prompts.json").read_text())
model = GlmDsaReference(gguf)
topk = model.hp.index_topk
llama = torch.load(cache)["llama.cpp"]
long = [k for k, p in enumerate(prompts) if len(p["ids"]) - 1 > topk]
report: dict[str, object] = {"verdict_kl_max": bound}
for fault in ("causal", "shift"):
    kls = []
    for k in long:
        n = len(prompts[k]["ids"])
        got = model.forward(prompts[k]["ids"], selection_fault=fault).logits[: n - 1]
        kls.append(round(agreement(got, llama[k][: n - 1], start=topk).kl_mean, 5))
    report[f"reference with selection_fault={fault}"] = {
        "kl_vs_llama.cpp": kls,
        "verdict": "PASS" if max(kls) <= bound else "FAIL",
    }
    print(fault, report[f"reference with selection_fault={fault}"], flush=True)
out.write_text(json.dumps(report, indent=1) + "\n")
