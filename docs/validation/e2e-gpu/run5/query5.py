"""Run 5: one server's prompt log-probs (whole distributions), greedy outputs, and the
same prompt log-probs sent concurrently (requests of different lengths in one batch).

usage: query5.py PORT PREFIX PROMPTS_JSON VOCAB [K]  -> PREFIX.json, PREFIX.npz
(K: log-probs per position asked for, default VOCAB: whole distributions; the rest -inf)
"""

import json
import os
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

port, prefix, prompts_path, vocab = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
k_req = int(sys.argv[5]) if len(sys.argv) > 5 else vocab
url = f"http://127.0.0.1:{port}/v1/completions"


def post(body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as e:
        return {"http_error": e.code, "body": e.read().decode()[:2000]}
    except OSError as e:
        return {"error": str(e)}


def tid(s: str) -> int:
    return int(s.split(":", 1)[1])


def prompt_lp(ids: list[int]) -> np.ndarray | dict[str, Any]:
    r = post(
        {
            "model": "glm-5",
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "echo": True,
            "logprobs": k_req,
            "return_tokens_as_token_ids": True,
        }
    )
    if "choices" not in r:
        return r
    lp = r["choices"][0]["logprobs"]
    m = np.full((len(ids) - 1, vocab), -np.inf, dtype=np.float32)
    for i, d in enumerate(lp["top_logprobs"][1 : len(ids)]):
        for s, v in (d or {}).items():
            m[i, tid(s)] = v
    return m


prompts = json.loads(Path(prompts_path).read_text())
summary: dict[str, Any] = {"port": port, "prompts": []}
arrays: dict[str, np.ndarray] = {}
for k, p in enumerate(prompts):
    rec: dict[str, Any] = {"n_tokens": len(p["ids"])}
    m = prompt_lp(p["ids"])
    if isinstance(m, dict):
        rec["error"] = m
    else:
        arrays[f"lp{k}"] = m
    g = post(
        {
            "model": "glm-5",
            "prompt": p["ids"],
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
    )
    if "choices" in g:
        rec["greedy_ids"] = [tid(s) for s in g["choices"][0]["logprobs"]["tokens"]]
    else:
        rec["greedy_error"] = g
    summary["prompts"].append(rec)
    print(prefix, k, rec.get("n_tokens"), rec.get("greedy_ids"), rec.get("error"), flush=True)

# all prompts at once: requests of different lengths share batches
with ThreadPoolExecutor(len(prompts)) as pool:
    together = list(pool.map(lambda p: prompt_lp(p["ids"]), prompts))
diffs = []
for k, m in enumerate(together):
    if isinstance(m, dict) or f"lp{k}" not in arrays:
        diffs.append(None)
        continue
    arrays[f"concurrent{k}"] = m
    a, b = arrays[f"lp{k}"], m
    fin = np.isfinite(a) & np.isfinite(b)
    diffs.append(float(np.abs(a[fin] - b[fin]).max()) if fin.any() else None)
summary["concurrent_vs_sequential_max_abs_logprob_diff"] = diffs
print(prefix, "concurrent vs sequential", diffs, flush=True)
np.savez_compressed(prefix + ".npz", **arrays)
Path(prefix + ".json").write_text(json.dumps(summary, indent=1))
