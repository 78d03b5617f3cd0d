"""Run 6c: decode tokens/s of one request at long contexts, several servers side by side.

usage: decode_bench6.py OUT.json NAME:PORT [NAME:PORT ...]
Env: CONTEXTS (default 4096,16384,65536), REPS (default 5), NTOK (default 512).
The prompts are run 5c's (decode_bench.py: seeded random ids, seed 20 + context). For each
context: one warm-up request per server (prefill; the prefix cache then holds the prompt),
then REPS rounds; in each round every server, in an order rotated from round to round,
gets max_tokens 1 and max_tokens NTOK + 1 (ignore_eos, greedy). A round's decode time per
token = (t(NTOK + 1) - t(1)) / NTOK; reported: the median over the rounds, with min and max.
Interleaving the servers spreads any drift of the machine over all of them alike.
"""

import json
import os
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

out = Path(sys.argv[1])
servers = [(a.split(":")[0], a.split(":")[1]) for a in sys.argv[2:]]
contexts = [int(x) for x in os.environ.get("CONTEXTS", "4096,16384,65536").split(",")]
reps, ntok = int(os.environ.get("REPS", "5")), int(os.environ.get("NTOK", "512"))


def post(port: str, body: dict[str, Any]) -> float:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), headers)
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        got = json.loads(r.read())
    dt = time.perf_counter() - t
    assert got["usage"]["completion_tokens"] == body["max_tokens"], got["usage"]
    return dt


results: list[dict[str, Any]] = []
for n in contexts:
    rnd = random.Random(20 + n)
    ids = [rnd.randrange(0, 2048) for _ in range(n)]
    base = {"model": "glm-5", "prompt": ids, "temperature": 0, "ignore_eos": True}
    warm = {name: round(post(port, base | {"max_tokens": 1}), 3) for name, port in servers}
    per_tok: dict[str, list[float]] = {name: [] for name, _ in servers}
    for r in range(reps):
        order = servers[r % len(servers) :] + servers[: r % len(servers)]
        for name, port in order:
            t1 = post(port, base | {"max_tokens": 1})
            tn = post(port, base | {"max_tokens": ntok + 1})
            per_tok[name].append((tn - t1) / ntok)
    for name, _ in servers:
        ms = [x * 1e3 for x in per_tok[name]]
        rec = {
            "server": name,
            "context": n,
            "first_request_s": warm[name],
            "decode_ms_per_token_rounds": [round(x, 4) for x in ms],
            "decode_ms_per_token_median": round(statistics.median(ms), 4),
            "decode_ms_per_token_min": round(min(ms), 4),
            "decode_ms_per_token_max": round(max(ms), 4),
            "decode_tok_s_median": round(1e3 / statistics.median(ms), 1),
        }
        results.append(rec)
        print(json.dumps(rec), flush=True)
    out.write_text(json.dumps({"reps": reps, "ntok": ntok, "results": results}, indent=1) + "\n")
