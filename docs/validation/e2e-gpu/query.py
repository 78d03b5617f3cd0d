"""Query a vLLM OpenAI server: full prompt log-probs (echo) and greedy outputs, token ids."""
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

port, prefix, prompts_path, vocab = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
url = f"http://127.0.0.1:{port}/v1/completions"


def post(body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result
    except urllib.error.HTTPError as e:
        return {"http_error": e.code, "body": e.read().decode()[:2000]}


def tid(s: str) -> int:
    return int(s.split(":", 1)[1])


with Path(prompts_path).open() as f:
    prompts: list[dict[str, Any]] = json.load(f)
summary: dict[str, Any] = {"port": port, "prompts": []}
arrays: dict[str, npt.NDArray[Any]] = {}
for k, p in enumerate(prompts):
    ids = p["ids"]
    rec: dict[str, Any] = {"n_tokens": len(ids)}
    t = time.time()
    for K in (vocab, 20):
        r = post({"model": "glm-5", "prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True,
                  "logprobs": K, "return_tokens_as_token_ids": True})
        if "choices" in r:
            break
        rec.setdefault("errors", []).append(r)
    rec["prompt_lp_seconds"] = round(time.time() - t, 3)
    if "choices" in r:
        lp = r["choices"][0]["logprobs"]
        rec["logprobs_k"] = K
        echoed = [tid(s) for s in lp["tokens"]]
        rec["echo_matches_prompt"] = echoed[: len(ids)] == ids
        m = np.full((len(ids) - 1, vocab), -np.inf, dtype=np.float32)
        for i, d in enumerate(lp["top_logprobs"][1: len(ids)]):
            for s, v in (d or {}).items():
                m[i, tid(s)] = v
        arrays[f"lp{k}"] = m
        rec["token_logprobs"] = lp["token_logprobs"][: len(ids)]
    g = post({"model": "glm-5", "prompt": ids, "max_tokens": 16, "temperature": 0, "logprobs": 5,
              "ignore_eos": True, "return_tokens_as_token_ids": True})
    if "choices" in g:
        c = g["choices"][0]
        rec["greedy_ids"] = [tid(s) for s in c["logprobs"]["tokens"]]
        rec["greedy_text"] = c["text"]
        rec["greedy_token_logprobs"] = c["logprobs"]["token_logprobs"]
        rec["greedy_top5"] = c["logprobs"]["top_logprobs"]
        rec["finish_reason"] = c["finish_reason"]
        arrays[f"greedy{k}"] = np.array(rec["greedy_ids"], dtype=np.int64)
    else:
        rec["greedy_error"] = g
    summary["prompts"].append(rec)
    print(prefix, k, {x: rec.get(x) for x in ("n_tokens", "logprobs_k", "echo_matches_prompt", "greedy_ids")},
          flush=True)
np.savez_compressed(prefix + ".npz", **arrays)
with Path(prefix + ".json").open("w") as f:
    json.dump(summary, f, indent=1)
