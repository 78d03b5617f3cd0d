"""Run 5c: decode tokens/s of one request at a long context on one server.

usage: decode_bench.py PORT PREFIX PROMPTS_JSON VOCAB [K]  (same arguments as query5.py;
VOCAB and K unused). For each context length: one warm-up request (prefill; the
prefix cache then holds the prompt), then 3 x max_tokens 1 and 3 x max_tokens 257
(ignore_eos, greedy); decode time per token = (median t257 - median t1) / 256.
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

port, prefix = sys.argv[1], sys.argv[2]
url = f"http://127.0.0.1:{port}/v1/completions"
rng_seed = 20


def post(body: dict[str, Any]) -> float:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    dt = time.perf_counter() - t
    assert out["usage"]["completion_tokens"] == body["max_tokens"], out["usage"]
    return dt


results = []
for n in (4096, 16384, 65536):
    rnd = random.Random(rng_seed + n)
    ids = [rnd.randrange(0, 2048) for _ in range(n)]
    base = {"model": "glm-5", "prompt": ids, "temperature": 0, "ignore_eos": True}
    t_first = post(base | {"max_tokens": 1})
    one = [post(base | {"max_tokens": 1}) for _ in range(3)]
    many = [post(base | {"max_tokens": 257}) for _ in range(3)]
    per_tok = (statistics.median(many) - statistics.median(one)) / 256
    rec = {
        "context": n,
        "first_request_s": round(t_first, 3),
        "t1_s": one,
        "t257_s": many,
        "decode_ms_per_token": round(per_tok * 1e3, 4),
        "decode_tok_s": round(1 / per_tok, 1),
    }
    results.append(rec)
    print(prefix, json.dumps(rec), flush=True)
Path(prefix + ".json").write_text(json.dumps(results, indent=1) + "\n")
