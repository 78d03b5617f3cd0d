"""Issue 23 (MTP run, prepared): greedy equality with and without MTP, acceptance per
draft position, decode tokens/s side by side, from query_mtp.py's JSON files.

usage: python3 compare_mtp.py RESULTS_DIR [PREFIX]
Pairs: each MTP server against the baseline of the same attention and graph mode
(sparse-mtp1, sparse-mtp3 vs sparse; sparse-mtp3-graphs vs sparse-graphs; dense-mtp3 vs
sparse only for speed, never for equality: dense attention differs past index_topk).
With PREFIX (run 9: chain): the servers PREFIX, PREFIX-graphs, PREFIX-mtpN[-graphs] and the
fault servers PREFIX-mtp3-graphs-{nc,fault}, each MTP server against PREFIX or
PREFIX-graphs. PREFIX chain also checks every greedy output against the constructed
fixture's own continuation (glm5_tools.fixtures.mtp_chain: the token after x is pi(x);
PYTHONPATH=src, PROMPTS=the prompts file) and names the first token off it.
Acceptance per position k = accepted tokens at position k / drafts (vLLM's own
definition in its spec-decode metrics). Exit 1 when a greedy output of a server that is
not a fault server differs.
"""

from __future__ import annotations

import json
import os
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


def servers(prefix: str | None) -> tuple[list[str], dict[str, str]]:
    if prefix is None:
        return (["sparse", "sparse-graphs", "sparse-mtp1", "sparse-mtp3", "sparse-mtp3-graphs", "dense-mtp3"],
                PAIRS)
    names = [prefix, f"{prefix}-mtp1", f"{prefix}-mtp3", f"{prefix}-graphs", f"{prefix}-mtp1-graphs",
             f"{prefix}-mtp3-graphs", f"{prefix}-mtp3-graphs-nc", f"{prefix}-mtp3-graphs-fault"]
    pairs = {n: (f"{prefix}-graphs" if "-graphs" in n else prefix) for n in names if "-mtp" in n}
    pairs[f"{prefix}-graphs"] = prefix  # two correct paths without MTP: the noise floor
    return names, pairs


def margin_gap(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """|top-1/top-2 log-prob margin of a - of b| at each generated position where both
    greedy outputs still agree: what a fault that moves the logits but not the argmax shows."""
    out = []
    for x, y in zip(a["prompts"], b["prompts"], strict=True):
        for tx, ty, mx, my in zip(x["greedy_ids"], y["greedy_ids"], x.get("greedy_margins", []),
                                  y.get("greedy_margins", []), strict=False):
            if tx != ty:
                break
            out.append(abs(mx - my))
    return out


def chain_expectation() -> Any:
    """Per held prompt, the constructed fixture's greedy continuation (successor chain)."""
    from glm5_tools.fixtures.mtp_chain import continuation, make_chain

    succ = make_chain(2048, 256).successor
    prompts = json.loads(Path(os.environ["PROMPTS"]).read_text())

    def expected(i: int, n: int) -> list[int]:
        return continuation(succ, int(prompts[i]["ids"][-1]), n)

    return expected


def main() -> int:
    d = Path(sys.argv[1])
    prefix = sys.argv[2] if len(sys.argv) > 2 else None
    names, pairs = servers(prefix)
    expected = chain_expectation() if prefix == "chain" else None
    rc = 0
    rows = []
    for name in names:
        res = load(d, name)
        if res is None:
            rows.append(f"{name}: no result (server did not come up or was not run)")
            continue
        spec = res.get("spec_decode", {})
        drafts = spec.get("vllm:spec_decode_num_drafts_total", 0.0)
        per_pos = sorted((k, v) for k, v in spec.items()
                         if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total"))
        acc = [round(v / drafts, 3) if drafts else None for _, v in per_pos]
        line = f"{name}: decode {res['decode_tokens_per_s']:.1f} tokens/s"
        if drafts:
            accepted = spec.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
            line += f"; drafts {drafts:.0f}, mean acceptance length {1 + accepted / drafts:.2f}, per position {acc}"
        base_name = pairs.get(name)
        base = load(d, base_name) if base_name else None
        repeats = [q.get("repeats_equal", True) for q in res["prompts"]]
        line += f"; repeats equal on {sum(repeats)}/{len(repeats)} prompts"
        margins = [m for q in res["prompts"] for m in q.get("greedy_margins", [])]
        if margins:
            line += f"; greedy top-1/top-2 margin min {min(margins):.3f}"
        if expected is not None:
            off = []
            for i, q in enumerate(res["prompts"]):
                want = expected(i, len(q["greedy_ids"]))
                k = next((j for j, (x, y) in enumerate(zip(q["greedy_ids"], want, strict=True)) if x != y), None)
                if k is not None:
                    off.append(f"prompt {i} at token {k}")
            n = len(res["prompts"])
            line += f"; follows the constructed chain on {n - len(off)}/{n} prompts"
            line += f" (off: {', '.join(off)})" if off else ""
        if base is not None:
            same = [a["greedy_ids"] == b["greedy_ids"] for a, b in zip(res["prompts"], base["prompts"], strict=True)]
            line += (f"; greedy equal to {base_name} on {sum(same)}/{len(same)} prompts; "
                     f"speed {res['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x {base_name}")
            gap = sorted(margin_gap(res, base))
            if prefix is not None and gap:
                line += (f"; margin vs {base_name} over {len(gap)} positions: median {gap[len(gap) // 2]:.3f}, "
                         f"max {gap[-1]:.3f}")
            for i, (a, b) in enumerate(zip(res["prompts"], base["prompts"], strict=True)):
                if a["greedy_ids"] != b["greedy_ids"]:
                    line += "\n    " + divergence(i, a, b, base_name)
            if not all(same) and not name.endswith(("-nc", "-fault")):
                rc = 1
        rows.append(line)
    print("\n".join(rows))
    return rc


if __name__ == "__main__":
    sys.exit(main())
