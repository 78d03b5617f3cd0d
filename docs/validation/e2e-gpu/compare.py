"""Compare vLLM's prompt log-probs / greedy outputs (GPU) with llama.cpp on the CPU (here)."""
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from llama_cpp import Llama

from glm5_tools.fixtures.reference import log_softmax, reference_logits

fix, vnpz, vjson, out = sys.argv[1:5]
with Path("docs/validation/e2e-gpu/prompts.json").open() as f:
    prompts: list[dict[str, Any]] = json.load(f)
v = np.load(vnpz)
with Path(vjson).open() as f:
    vj: dict[str, Any] = json.load(f)


def greedy(path: str, ids: list[int], n: int = 16) -> list[int]:
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_gpu_layers=0, logits_all=True, verbose=False, n_threads=4)
    toks: list[int] = list(ids)
    res: list[int] = []
    llm.eval(toks)
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        res.append(t)
        llm.eval([t])
    llm.close()
    return res


report: dict[str, Any] = {}
for name in ("tiny-glm5-BF16.gguf", "tiny-glm5-UD-Q4_K_XL.gguf"):
    path = f"{fix}/gguf/{name}"
    rows: list[dict[str, Any]] = []
    allkl: list[npt.NDArray[np.float64]] = []
    agree, npos = 0, 0
    for k, p in enumerate(prompts):
        ref = reference_logits(path, p["ids"])
        lq = log_softmax(ref.logits[:-1])  # llama.cpp: next-token dists at positions 0..n-2
        lv = v[f"lp{k}"].astype(np.float64)  # vLLM: same positions (prompt logprobs of tokens 1..n-1)
        pv = np.exp(lv)
        kl = (pv * (lv - lq)).sum(-1)  # KL(vLLM || llama.cpp)
        a = int((lv.argmax(-1) == lq.argmax(-1)).sum())
        lpv = np.array(vj["prompts"][k]["token_logprobs"][1:], dtype=np.float64)
        g_ref = greedy(path, p["ids"])
        g_v = vj["prompts"][k]["greedy_ids"]
        same = next((i for i, (x, y) in enumerate(zip(g_ref, g_v, strict=False)) if x != y), 16)
        rows.append({"prompt": k, "n_tokens": len(p["ids"]), "top1_agree": f"{a}/{len(lv)}",
                     "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                     "prompt_lp_maxabs": float(np.abs(lpv - ref.prompt_logprobs).max()),
                     "greedy_common_prefix": same, "greedy_llama_cpp": g_ref, "greedy_vllm": g_v})
        allkl.append(kl)
        agree += a
        npos += len(lv)
        print(name, rows[-1]["prompt"], rows[-1]["top1_agree"], round(rows[-1]["kl_mean"], 5),
              round(rows[-1]["kl_max"], 5), round(rows[-1]["prompt_lp_maxabs"], 4), same, flush=True)
    kl = np.concatenate(allkl)
    report[name] = {"positions": npos, "top1_agree": agree, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                    "per_prompt": rows}
    print(name, "ALL", agree, npos, kl.mean(), kl.max())
with Path(out).open("w") as f:
    json.dump(report, f, indent=1)
