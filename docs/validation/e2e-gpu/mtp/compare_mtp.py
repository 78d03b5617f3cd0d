"""Issue 23 (MTP run, prepared): greedy equality with and without MTP, acceptance per
draft position, decode tokens/s side by side, from query_mtp.py's JSON files.

usage: python3 compare_mtp.py RESULTS_DIR
Pairs: each MTP server against the baseline of the same attention and graph mode
(sparse-mtp1, sparse-mtp3 vs sparse; sparse-mtp3-graphs vs sparse-graphs; dense-mtp3 vs
sparse only for speed, never for equality: dense attention differs past index_topk).
Acceptance per position k = accepted tokens at position k / drafts (vLLM's own
definition in its spec-decode metrics). Exit 1 when a greedy output differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PAIRS = {"sparse-mtp1": "sparse", "sparse-mtp3": "sparse", "sparse-mtp3-graphs": "sparse-graphs"}


def load(d: Path, name: str) -> dict[str, Any] | None:
    f = d / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None


def divergence(i: int, a: dict[str, Any], b: dict[str, Any], base_name: str) -> str:
    """Where two greedy outputs first part, and how close the baseline's top-2 was there
    (a margin of a few hundredths is a near-tie that summation order can flip)."""
    k = next(j for j, (x, y) in enumerate(zip(a["greedy_ids"], b["greedy_ids"], strict=True)) if x != y)
    mb = b.get("greedy_margins", [None] * (k + 1))[k]
    ma = a.get("greedy_margins", [None] * (k + 1))[k]
    return (f"prompt {i}: first differs at generated token {k} of {len(a['greedy_ids'])}; "
            f"top-1/top-2 margin there: {base_name} {mb}, this {ma}")


def main() -> int:
    d = Path(sys.argv[1])
    rc = 0
    rows = []
    for name in ("sparse", "sparse-graphs", "sparse-mtp1", "sparse-mtp3", "sparse-mtp3-graphs", "dense-mtp3"):
        res = load(d, name)
        if res is None:
            rows.append(f"{name}: no result (server did not come up or was not run)")
            continue
        spec = res.get("spec_decode", {})
        drafts = spec.get("vllm:spec_decode_num_drafts_total", 0.0)
        per_pos = sorted((k, v) for k, v in spec.items()
                         if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos"))
        acc = [round(v / drafts, 3) if drafts else None for _, v in per_pos]
        line = f"{name}: decode {res['decode_tokens_per_s']:.1f} tokens/s"
        if drafts:
            accepted = spec.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
            line += f"; drafts {drafts:.0f}, mean acceptance length {1 + accepted / drafts:.2f}, per position {acc}"
        base_name = PAIRS.get(name)
        base = load(d, base_name) if base_name else None
        repeats = [q.get("repeats_equal", True) for q in res["prompts"]]
        line += f"; repeats equal on {sum(repeats)}/{len(repeats)} prompts"
        if base is not None:
            same = [a["greedy_ids"] == b["greedy_ids"] for a, b in zip(res["prompts"], base["prompts"], strict=True)]
            line += (f"; greedy equal to {base_name} on {sum(same)}/{len(same)} prompts; "
                     f"speed {res['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x {base_name}")
            for i, (a, b) in enumerate(zip(res["prompts"], base["prompts"], strict=True)):
                if a["greedy_ids"] != b["greedy_ids"]:
                    line += "\n    " + divergence(i, a, b, base_name)
            if not all(same):
                rc = 1
        rows.append(line)
    print("\n".join(rows))
    return rc


if __name__ == "__main__":
    sys.exit(main())
