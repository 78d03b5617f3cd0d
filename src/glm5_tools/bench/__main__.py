"""``python -m glm5_tools.bench plan|report``: the controller side of playbooks/bench.yml.

plan    expand the profiles into points with their generator command lines (JSON out)
report  read a run directory, write summary.json, report.md and the plots; print the
        verdict as JSON (exit 0 whatever the verdict: the play asserts it; 2 on bad input)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glm5_tools.bench.plan import PlanError, Settings, expand
from glm5_tools.bench.report import ReportError, build


def _plan(args: argparse.Namespace) -> int:
    profiles = json.loads(args.profiles)
    settings_doc = json.loads(args.settings)
    settings_doc["wrapper"] = tuple(settings_doc.get("wrapper", ()))
    settings = Settings(**settings_doc)
    points, skipped = expand(profiles, json.loads(args.selected), args.max_model_len, settings)
    doc = {"max_model_len": args.max_model_len, "points": [p.as_dict() for p in points], "skipped": skipped}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))
    return 0


def _report(args: argparse.Namespace) -> int:
    thresholds = json.loads(Path(args.thresholds).read_text())
    verdict, _summary = build(Path(args.run_dir), thresholds, args.regression_pct,
                             [f for f in args.regression_figures.split(",") if f], args.title)
    print(json.dumps({"ok": verdict.ok, "failures": verdict.failures, "not_measured": verdict.not_measured,
                      "previous_run": verdict.previous_run,
                      "report": str(Path(args.run_dir) / "report.md")}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glm5-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan")
    plan.add_argument("--profiles", required=True, help="JSON mapping of profile name to profile")
    plan.add_argument("--selected", required=True, help="JSON list of the profiles to run")
    plan.add_argument("--max-model-len", type=int, required=True)
    plan.add_argument("--settings", required=True, help="JSON of glm5_tools.bench.plan.Settings")
    plan.add_argument("--out", default="")
    report = sub.add_parser("report")
    report.add_argument("--run-dir", required=True)
    report.add_argument("--thresholds", required=True, help="a JSON file: list of thresholds")
    report.add_argument("--regression-pct", type=float, default=10.0)
    report.add_argument("--regression-figures", default="output_throughput,tokens_per_user,p50_ttft_ms,p50_tpot_ms")
    report.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        return _plan(args) if args.command == "plan" else _report(args)
    except (PlanError, ReportError, KeyError, TypeError, json.JSONDecodeError, FileNotFoundError) as exc:
        print(f"glm5-bench {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
