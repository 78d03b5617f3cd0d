"""Issue 23 item 3, on the CPU: what the fp8 latent cache (vLLM's fp8_ds_mla layout,
patch 0013) costs GLM-5's sparse attention on the fixtures, in the float32 reference.

usage: PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/fp8/reference_fp8.py GGUF OUT.json
The reference model (glm5_tools.diagnostics.dsa_reference, vLLM's fp8 indexer rounding:
attention="sparse-fp8") with its MLA latent c and k_pe kept as a bf16 cache keeps them
and as the fp8_ds_mla cache keeps them (latent_cache_rounding), on run 5's held prompts:
KL and top-1 of each against llama.cpp's logits of the same GGUF (below and from
index_topk), and of the fp8 one against the bf16 one. Everything else stays float32,
so the difference is the cache's rounding alone (the served run, fp8/run.sh, adds the
kernels' bf16 arithmetic).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference, agreement, latent_cache_rounding
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

HERE = Path(__file__).resolve().parent


def main() -> None:
    gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
    prompts = json.loads((HERE.parent / "run5" / "prompts.json").read_text())
    model = GlmDsaReference(gguf)
    topk = model.hp.index_topk
    report: dict[str, object] = {"gguf": gguf.name, "index_topk": topk, "prompts": []}
    for p in prompts:
        ids = p["ids"]
        ll = llama_cpp_logits(gguf, ids)
        logits = {}
        for kind in ("float32", "bf16", "fp8_ds_mla"):
            model.latent_cache = None if kind == "float32" else latent_cache_rounding(kind)
            logits[kind] = model.forward(ids, attention="sparse-fp8").logits
        model.latent_cache = None
        row: dict[str, object] = {"n_tokens": len(ids)}
        for kind, lg in logits.items():
            row[f"{kind} vs llama.cpp, all"] = agreement(lg, ll).as_dict()
            if len(ids) > topk:
                row[f"{kind} vs llama.cpp, from index_topk"] = agreement(lg, ll, start=topk).as_dict()
        row["fp8_ds_mla vs bf16 (KL(bf16 || fp8))"] = agreement(logits["fp8_ds_mla"], logits["bf16"]).as_dict()
        report["prompts"].append(row)  # type: ignore[attr-defined]
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
