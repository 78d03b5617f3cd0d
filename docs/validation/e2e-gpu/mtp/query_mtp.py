"""Issue 23 (MTP run, prepared): one server's greedy completions of the held prompts,
single-stream decode time, and vLLM's spec-decode counters (/metrics) before and after.
Per prompt also: whether the REPEATS greedy outputs were equal, and each position's
margin between the top-1 and top-2 log-probs (logprobs 2), so that a divergence between
two servers can be told apart as a near-tie or not.

usage: python3 query_mtp.py PORT OUT.json PROMPTS.json [MAX_TOKENS]
Each prompt is sent alone (single stream), greedy (temperature 0), token ids in and out:
once with max_tokens 1 (prefill + one token) and once with MAX_TOKENS (default 128);
decode seconds per token = (t_max - t_1) / (MAX_TOKENS - 1), repeated REPEATS times
(median). The counters' difference over the queries gives drafts, draft tokens,
accepted tokens and accepted tokens per draft position (absent without MTP).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

PORT, OUT, PROMPTS = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
MAX_TOKENS = int(sys.argv[4]) if len(sys.argv) > 4 else 128
REPEATS = int(os.environ.get("REPEATS", "3"))
BASE = f"http://127.0.0.1:{PORT}"


def _headers() -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        h["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    return h


def complete(ids: list[int], max_tokens: int) -> tuple[list[int], list[float], float]:
    """Greedy ids, the margin top-1 minus top-2 log-prob at each position, seconds."""
    body = {"model": "glm-5", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": 2, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(f"{BASE}/v1/completions", json.dumps(body).encode(), _headers())
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        data: dict[str, Any] = json.loads(r.read())
    took = time.perf_counter() - t
    lp = data["choices"][0]["logprobs"]
    tokens = [int(s.split(":", 1)[1]) for s in lp["tokens"]]
    margins = []
    for top in lp["top_logprobs"]:
        values = sorted((float(v) for v in top.values()), reverse=True)
        margins.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return tokens, margins, took


def counters() -> dict[str, float]:
    """vLLM's spec-decode counters (vllm:spec_decode_*_total), position-labelled ones
    as name[position]."""
    req = urllib.request.Request(f"{BASE}/metrics", headers=_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_") or "_created" in line.split(" ", 1)[0]:
            continue  # (the _created series are creation timestamps, not counts)
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if 'position="' in name_labels:
            name += "[" + name_labels.split('position="', 1)[1].split('"', 1)[0] + "]"
        out[name] = out.get(name, 0.0) + float(value)
    return out


def main() -> None:
    prompts: list[dict[str, Any]] = json.loads(PROMPTS.read_text())
    before = counters()
    result: dict[str, Any] = {"port": PORT, "max_tokens": MAX_TOKENS, "prompts": []}
    for p in prompts:
        ids = [int(i) for i in p["ids"]]
        per_token = []
        runs: list[list[int]] = []
        margins: list[float] = []
        for _ in range(REPEATS):
            _, _, t1 = complete(ids, 1)
            greedy, margins, tn = complete(ids, MAX_TOKENS)
            runs.append(greedy)
            per_token.append((tn - t1) / (MAX_TOKENS - 1))
        result["prompts"].append({"n_prompt": len(ids), "greedy_ids": runs[-1],
                                  "greedy_margins": margins,
                                  "repeats_equal": all(r == runs[0] for r in runs),
                                  "decode_s_per_token": statistics.median(per_token),
                                  "decode_s_per_token_runs": per_token})
    after = counters()
    result["spec_decode"] = {k: after[k] - before.get(k, 0.0) for k in sorted(after)}
    result["decode_tokens_per_s"] = 1.0 / statistics.median(
        [q["decode_s_per_token"] for q in result["prompts"]])
    OUT.write_text(json.dumps(result, indent=1))
    print(json.dumps({"decode_tokens_per_s": round(result["decode_tokens_per_s"], 1),
                      "spec_decode": result["spec_decode"]}))


if __name__ == "__main__":
    main()
