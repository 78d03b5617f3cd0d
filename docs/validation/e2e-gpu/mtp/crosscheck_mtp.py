"""Issue 23 item 6: is each server's greedy output what the reference model would say,
position by position? (teacher-forced check, robust to ties)

usage: python3 crosscheck_mtp.py REF_PORT RESULTS_DIR REF_NAME SUBJECT...

Greedy equality between two servers fails on this fixture for reasons that say nothing
about correctness: the tiny random GLM-5 has 13-23 % of its greedy positions within 0.1
of a tie (exact bf16 ties too), and two correct paths (eager against CUDA graphs, no
MTP) part at token 0-11 (run 7). So each subject's greedy sequence (query_mtp.py's
`greedy_ids`) is fed back to the reference server as a prompt (max_tokens 1,
prompt_logprobs 5): at every generated position j the reference scores the subject's
token given the subject's own prefix. The deficit there is the reference's best
log-prob minus its log-prob of the subject's token (0 when the subject chose the
reference's argmax; small at near-ties; large when the subject's model differs, e.g. a
verification step that sees its own later draft tokens). A token outside the
reference's top 5 counts as a deficit of at least (top-1 - 5th) and is flagged.

Writes RESULTS_DIR/crosscheck.json and prints, per subject, the deficit's quantiles,
the positions over 0.25 and 1.0, and the worst positions.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any


def _headers() -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        h["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    return h


def prompt_logprobs(port: str, ids: list[int]) -> list[dict[int, float] | None]:
    body = {"model": "glm-5", "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 5}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), _headers())
    with urllib.request.urlopen(req, timeout=300) as r:
        data: dict[str, Any] = json.loads(r.read())
    out: list[dict[int, float] | None] = []
    for entry in data["choices"][0]["prompt_logprobs"]:
        out.append(None if entry is None else {int(k): float(v["logprob"]) for k, v in entry.items()})
    return out


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main() -> None:
    port, results, ref_name, subjects = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
    report: dict[str, Any] = {"reference": ref_name, "subjects": {}}
    for name in subjects:
        f = results / f"{name}.json"
        if not f.exists():
            print(f"{name}: no result")
            continue
        res = json.loads(f.read_text())
        deficits: list[float] = []
        outside = 0
        worst: list[tuple[float, int, int]] = []
        prompts = json.loads(Path(os.environ["PROMPTS"]).read_text())
        for i, (p, q) in enumerate(zip(prompts, res["prompts"], strict=True)):
            ids = [int(x) for x in p["ids"]]
            greedy = [int(x) for x in q["greedy_ids"]]
            lps = prompt_logprobs(port, ids + greedy)
            for j, tok in enumerate(greedy):
                entry = lps[len(ids) + j]
                assert entry is not None
                best = max(entry.values())
                if tok in entry:
                    d = best - entry[tok]
                else:  # not in the top 5 (vLLM adds the actual token; kept for safety)
                    outside += 1
                    d = best - min(entry.values())
                deficits.append(d)
                worst.append((d, i, j))
        worst.sort(reverse=True)
        s = {"positions": len(deficits), "outside_top5": outside,
             "median": quantile(deficits, 0.5), "p90": quantile(deficits, 0.9),
             "p99": quantile(deficits, 0.99), "max": max(deficits),
             "over_0.25": sum(d > 0.25 for d in deficits), "over_1.0": sum(d > 1.0 for d in deficits),
             "worst": [{"deficit": round(d, 4), "prompt": i, "token": j} for d, i, j in worst[:5]]}
        report["subjects"][name] = s
        print(f"{name} vs {ref_name}: {s['positions']} positions, deficit median {s['median']:.3f} "
              f"p90 {s['p90']:.3f} p99 {s['p99']:.3f} max {s['max']:.3f}; "
              f"> 0.25: {s['over_0.25']}, > 1.0: {s['over_1.0']}, outside top 5: {outside}; "
              f"worst {s['worst'][:3]}")
    (results / "crosscheck.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
