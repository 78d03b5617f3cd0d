"""Markdown tables from bench.py's results.json (medians in ms, ratios side by side).

usage: python summarize.py results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    bw = res["read_bandwidth_GBps_measured"]
    print(f"{res['device']} (SM {res['capability'][0]}.{res['capability'][1]}), read bandwidth measured {bw:.0f} GB/s")
    print()
    print(
        "| ctx | batch | heads | (a) new ms: idx / top-k / MLA = total | (b) main ms: idx / top-k / MLA = total "
        "| (c) dense ms | (d) FlashMLA sparse ms (MLA; sum) | b/a | c/a | a/d | (a) GB/s (% of measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        m = r["ms"]
        a, b, c, d = m["a_total"], m["b_total"], m.get("c_total"), m.get("d_total_parts_sum")
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {r['heads']} "
            f"| {fmt(m['a_indexer'])} / {fmt(m['a_topk'])} / {fmt(m['a_mla'])} = **{fmt(a)}** "
            f"| {fmt(m['b_indexer'])} / {fmt(m['b_topk'])} / {fmt(m['b_mla'])} = {fmt(b)} "
            f"| {fmt(c)} | {fmt(m.get('d_mla'))}; {fmt(d)} "
            f"| {b / a:.2f} | {fmt(c / a if c else None, 2)} | {fmt(a / d if d else None, 2)} "
            f"| {r['a_GBps']:.0f} ({100 * r['a_GBps'] / bw:.0f} %) |"
        )
    sweep = [k for k in res["runs"][0]["ms"] if k.startswith("a_indexer_bn")] if res["runs"] else []
    if sweep:
        print()
        print("| ctx | batch | heads | indexer ms, (a) as run | " + " | ".join(sweep) + " |")
        print("|---|---|---|---|" + "---|" * len(sweep))
        for r in res["runs"]:
            m = r["ms"]
            cells = " | ".join(fmt(m.get(k)) for k in sweep)
            print(f"| {r['ctx'] // 1024}k | {r['batch']} | {r['heads']} | {fmt(m['a_indexer'])} | {cells} |")


if __name__ == "__main__":
    main()
