"""Run 6d: a causality check of a served model, without an oracle. Two prompts that differ
only in the token at position m (the true one and another) must give the same next-token
distributions at every position before m: a token's output may depend on earlier tokens
only. Sent one after the other, the two requests have the same shapes, so a correct
deterministic server gives equal log-probs there (prompt log-probs are computed without
the prefix cache).

usage: causal6.py PORT OUT.json PROMPTS_JSON PROMPT_INDEX CUT [CUT ...]
Per cut m: max |log-prob difference| over the top-20 of positions < m (and of position m - 1,
the one a model that sees one token ahead changes first), the positions that differ, and the
top-1 agreement there.
"""

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

port, out = sys.argv[1], Path(sys.argv[2])
prompt = json.loads(Path(sys.argv[3]).read_text())[int(sys.argv[4])]["ids"]
cuts = [int(x) for x in sys.argv[5:]]


def prompt_lps(ids: list[int]) -> list[dict[str, float]]:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    body: dict[str, Any] = {
        "model": "glm-5",
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0,
        "echo": True,
        "logprobs": 20,
        "return_tokens_as_token_ids": True,
    }
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=300) as r:
        got = json.loads(r.read())
    # entry i + 1 is the distribution of token i + 1 given tokens <= i (computed at position i)
    return [d or {} for d in got["choices"][0]["logprobs"]["top_logprobs"][1 : len(ids)]]


def diff(a: dict[str, float], b: dict[str, float]) -> tuple[float, bool]:
    """Largest |log-prob difference| over the tokens both entries list, and whether their
    best tokens agree. (vLLM lists the top-20 and the prompt token itself: at position m - 1
    that is the token the two prompts differ in, so only the shared tokens are compared.)"""
    keys = set(a) & set(b)
    d = max((abs(a[t] - b[t]) for t in keys), default=0.0)
    return d, max(a, key=a.__getitem__) == max(b, key=b.__getitem__)


rows = []
for m in cuts:
    true = prompt[: m + 1]
    other = [*prompt[:m], (prompt[m] + 1) % 2048]
    a, b = prompt_lps(true), prompt_lps(other)
    before = [diff(a[i], b[i]) for i in range(m)]  # positions 0 .. m - 1
    rec = {
        "cut": m,
        "max_abs_diff_before_cut": round(max(d for d, _ in before), 6),
        "positions_differing": sum(1 for d, _ in before if d > 0),
        "differing_positions": [i for i, (d, _) in enumerate(before) if d > 0][:12],
        "top1_agreement_before_cut": round(sum(1 for _, t in before if t) / m, 4),
        "diff_at_position_m_minus_1": round(before[m - 1][0], 6),
    }
    rows.append(rec)
    print(json.dumps(rec), flush=True)
causal = all(r["max_abs_diff_before_cut"] == 0 for r in rows)
verdict = "PASS (causal)" if causal else "FAIL (an output depends on a later token)"
out.write_text(json.dumps({"port": port, "cuts": rows, "verdict": verdict}, indent=1) + "\n")
print(verdict)
