"""Markdown tables from bench.py's results.json (medians in ms, ratios side by side).

usage: python summarize.py results.json  (bench.py's or idx_bench.py's)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def idx_tables(res: dict) -> None:
    """idx_bench.py's results: the score kernel alone, old / new / DeepGEMM, then the variants."""
    bw = res["read_bandwidth_GBps_measured"]
    print(f"{res['device']} (SM {res['capability'][0]}.{res['capability'][1]}), read bandwidth measured {bw:.0f} GB/s")
    print()
    print("| ctx | batch | MB | old ms | new ms | DeepGEMM ms | old/new | new/DeepGEMM | new GB/s (% of measured) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        m = r["ms"]
        o, n, d = m.get("old"), m.get("new"), m.get("deepgemm")
        g = r["bytes"] / n / 1e6 if n else None
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {r['bytes'] / 1e6:.1f} | {fmt(o)} | **{fmt(n)}** | {fmt(d)} "
            f"| {fmt(o / n if o and n else None, 2)} | {fmt(n / d if n and d else None, 2)} "
            f"| {fmt(g, 0)} ({fmt(100 * g / bw if g else None, 0)} %) |"
        )
    names = list(dict.fromkeys(k for r in res["runs"] for k in r["ms"] if k not in ("old", "new", "deepgemm")))
    if names:
        print()
        print("| ctx | batch | new | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(names))
        for r in res["runs"]:
            m = r["ms"]
            print(
                f"| {r['ctx'] // 1024}k | {r['batch']} | {fmt(m.get('new'))} | "
                + " | ".join(fmt(m.get(k)) for k in names)
                + " |"
            )
    errs = {f"{r['ctx'] // 1024}k/{r['batch']}": r["errors"] for r in res["runs"] if r.get("errors")}
    if errs:
        print()
        print("errors:", json.dumps(errs))


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    if res["runs"] and "old" in res["runs"][0]["ms"]:
        idx_tables(res)
        return
    bw = res["read_bandwidth_GBps_measured"]
    print(f"{res['device']} (SM {res['capability'][0]}.{res['capability'][1]}), read bandwidth measured {bw:.0f} GB/s")
    print()
    print(
        "| ctx | batch | heads | (a) new ms: idx / top-k / MLA = total | (b) before ms: idx / top-k / MLA = total "
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
    print()
    print(
        "| ctx | batch | indexer MB | (b) ms | (a) ms | (d) DeepGEMM ms | b/a | a/d "
        "| (a) GB/s (% of measured) | (d) GB/s (% of measured) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        if r["heads"] != 8:
            continue
        m = r["ms"]
        nbytes = r["batch"] * r["ctx"] * 132  # fp8 row + fp32 scale per position
        a, b, d = m["a_indexer"], m["b_indexer"], m.get("d_indexer")
        ga, gd = nbytes / a / 1e6, (nbytes / d / 1e6 if d else None)
        print(
            f"| {r['ctx'] // 1024}k | {r['batch']} | {nbytes / 1e6:.1f} | {fmt(b)} | **{fmt(a)}** | {fmt(d)} "
            f"| {b / a:.2f} | {fmt(a / d if d else None, 2)} | {ga:.0f} ({100 * ga / bw:.0f} %) "
            f"| {fmt(gd, 0)} ({fmt(100 * gd / bw if gd else None, 0)} %) |"
        )
    sweep = sorted(
        {k for r in res["runs"] for k in r["ms"] if k.startswith("a_indexer_")},
        key=list(dict.fromkeys(k for r in res["runs"] for k in r["ms"])).index,
    )
    if sweep:
        print()
        print("Score kernel variants, ms (8 heads; the indexer does not depend on them):")
        print()
        print("| ctx | batch | (a) as run | " + " | ".join(k.removeprefix("a_indexer_") for k in sweep) + " |")
        print("|---|---|---|" + "---|" * len(sweep))
        for r in res["runs"]:
            m = r["ms"]
            if not any(k in m for k in sweep):
                continue
            cells = " | ".join(fmt(m.get(k)) for k in sweep)
            print(f"| {r['ctx'] // 1024}k | {r['batch']} | {fmt(m['a_indexer'])} | {cells} |")


if __name__ == "__main__":
    main()
