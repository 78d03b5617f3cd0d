"""Run 6c, here: does the served 0011 of issue 23 give the same prompt log-probs for the same
prompt (main fixture, index_topk 2048: the persistent_topk path) from run to run? Compares
query5.py's arrays (top-20 log-probs per position) of two requests: top-1 agreement and the
largest |log-prob difference| at positions < index_topk and >= it, and the first position
that differs.

usage: .venv-ml/bin/python docs/validation/e2e-gpu/run6/determinism6.py OUT.json \
         NAME=A.npz:KEY_A,B.npz:KEY_B ...   (KEY: lp0, concurrent1, ...)
"""

import json
import sys
from pathlib import Path

import numpy as np

TOPK = 2048
out, pairs = sys.argv[1], sys.argv[2:]
report = {}
for spec in pairs:
    name, rest = spec.split("=", 1)
    (fa, ka), (fb, kb) = (x.split(":") for x in rest.split(","))
    a, b = np.load(fa)[ka], np.load(fb)[kb]
    am = np.where(np.isfinite(a), a, -np.inf).argmax(-1)
    bm = np.where(np.isfinite(b), b, -np.inf).argmax(-1)
    both = np.isfinite(a) & np.isfinite(b)
    d = np.where(both, np.abs(np.where(both, a, 0) - np.where(both, b, 0)), 0).max(-1)
    report[name] = {
        "positions": int(a.shape[0]),
        "top1_agreement_below_topk": round(float((am[:TOPK] == bm[:TOPK]).mean()), 4),
        "top1_agreement_from_topk": round(float((am[TOPK:] == bm[TOPK:]).mean()), 4),
        "max_abs_diff_below_topk": round(float(d[:TOPK].max()), 4),
        "max_abs_diff_from_topk": round(float(d[TOPK:].max()), 4),
        "first_differing_position": int(np.argmax(d > 0)) if (d > 0).any() else None,
    }
    print(name, report[name])
Path(out).write_text(json.dumps(report, indent=1) + "\n")
