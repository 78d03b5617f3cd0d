"""python -m glm5_tools.sm_check: compile GLM-5's serving-path Triton kernels for targets.

Run it where the patched vLLM imports (the deployed host's ml-env, or with
PYTHONPATH set to a patched overlay as devtests does). Exit 0 when every launch
of every target fits that target; 1 with each problem named otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .compile import KernelResult, compile_all, dedupe
from .report import markdown, problems, warnings
from .targets import Target, target
from .trace import ArgSpec, LaunchRecord, untraced


def apply_overrides(records: list[LaunchRecord], overrides: list[str]) -> int:
    """--override KERNEL:NAME=INT[,NAME=INT...] sets a recorded constexpr or launch
    option of every launch of KERNEL (what-if, and the check's own fault test)."""
    changed = 0
    for item in overrides:
        kernel, _, assignments = item.partition(":")
        if not assignments:
            raise SystemExit(f"--override {item!r}: expected KERNEL:NAME=VALUE[,NAME=VALUE]")
        values: dict[str, int] = {}
        for a in assignments.split(","):
            key, _, number = a.partition("=")
            values[key.strip()] = int(number)
        for rec in records:
            if rec.name == kernel:
                for key, value in values.items():
                    rec.kwargs[key] = ArgSpec("int", value)
                changed += 1
        if not any(rec.name == kernel for rec in records):
            raise SystemExit(f"--override {item!r}: no launch of {kernel} was recorded")
    return changed


def check_libraries(site: Path, targets: list[Target]) -> tuple[str, list[str], dict[str, Any]]:
    """The compiled-library ops of the serving path: sm kernels per op, per target."""
    from .libs import check_ops, serving_ops

    uses = serving_ops(site)
    failures: list[str] = []
    data: dict[str, Any] = {}
    lines = [
        "| op | called from | " + " | ".join(f"{t.name} kernels" for t in targets) + " | verdict |",
        "|---|---|" + "---|" * len(targets) + "---|",
    ]
    results = {t.name: check_ops(site, t.name, uses) for t in targets}
    for i, first in enumerate(results[targets[0].name]):
        cells = [f"`{first.op}`", ", ".join(first.callers)]
        verdict = "ok"
        for t in targets:
            r = results[t.name][i]
            if r.pattern is None:
                cells.append("(not mapped)")
                verdict = "not mapped: not on GLM-5's configuration, or host-only"
                continue
            names = sorted({k for ks in r.kernels.values() for k in ks})
            count = sum(len(v) for v in r.kernels.values())
            cells.append(f"{count}: " + ", ".join(f"`{n}`" for n in names[:3]) if count else "none")
            if not r.ok:
                verdict = "FAIL"
                failures.append(f"{r.op}: no {t.name} kernel matching {r.pattern} in vLLM's libraries")
        cells.append(verdict)
        lines.append("| " + " | ".join(cells) + " |")
        data[first.op] = {t.name: results[t.name][i].kernels for t in targets}
    archs = results[targets[0].name][0].library_archs if results[targets[0].name] else {}
    head = "## Compiled-library ops of the serving path\n\nSASS in the wheel: " + "; ".join(
        f"{lib}: {', '.join(a)}" for lib, a in archs.items()
    )
    return head + "\n\n" + "\n".join(lines) + "\n", failures, {"ops": data, "archs": archs}


def run(args: argparse.Namespace) -> int:
    from . import glm5

    targets = [target(t) for t in args.target]
    cache = None if args.no_cache else Path(args.cache)
    start = time.monotonic()
    results: list[KernelResult] = []
    report: dict[str, Any] = {"targets": [t.name for t in targets], "traces": {}}
    failures: list[str] = []
    notes: list[str] = []
    text = [f"# Triton kernels of the serving path, compiled for {', '.join(t.name for t in targets)}\n"]
    for i, t in enumerate(targets):
        t0 = time.monotonic()
        tps = tuple(args.tp) if args.tp else glm5.TPS
        gguf_tps = tuple(args.gguf_tp) if args.gguf_tp else glm5.GGUF_TPS
        rec = glm5.trace_all(t, dense=not args.no_dense, tps=tps, gguf_tps=gguf_tps)
        for name in untraced(rec.unique(), args.require_traced):
            failures.append(f"{name}: a Triton kernel of a required module that no scenario launched")
        unique = rec.unique()
        if args.override:
            apply_overrides(unique, args.override)
        unique = dedupe(unique, t)
        compile_for = targets if (i == 0 and args.cross) else [t]
        res = compile_all(unique, compile_for, cache, args.jobs)
        results += res
        mine = [r for r in res if r.target == t.name]
        for r in mine:
            failures += problems(r, t, spills_fail=args.fail_on_spills)
            notes += [] if args.fail_on_spills else warnings(r, t)
        report["traces"][t.name] = {
            "launches": len(rec.launches),
            "unique": len(unique),
            "records": [r.to_json() for r in unique],
            "results": [r.to_json() for r in res],
            "ops": {op: len(s) for op, s in sorted(rec.ops.items())},
            "seconds": round(time.monotonic() - t0, 1),
        }
        print(
            f"{t.name}: {len(rec.launches)} launches traced, {len(unique)} distinct configurations, "
            f"compiled for {', '.join(c.name for c in compile_for)} in {time.monotonic() - t0:.1f} s "
            f"({sum(r.cached for r in res)} from cache)",
            file=sys.stderr,
        )
    text.append(markdown(results, targets))
    if args.libs:
        lib_text, lib_failures, lib_report = check_libraries(Path(args.libs), targets)
        text.append(lib_text)
        failures += lib_failures
        report["libraries"] = lib_report
    report["failures"] = failures
    report["warnings"] = notes
    report["seconds"] = round(time.monotonic() - start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(text), encoding="utf-8")
    for w in notes:
        print(f"WARN {w}", file=sys.stderr)
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    summary = {
        "targets": [t.name for t in targets],
        "configurations": {k: v["unique"] for k, v in report["traces"].items()},
        "failures": len(failures),
        "warnings": len(notes),
        "seconds": report["seconds"],
    }
    print(json.dumps(summary))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm5_tools.sm_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", action="append", help="sm_120 (first = primary), sm_90, sm_100; repeatable")
    p.add_argument("--json", help="write records, results and failures here")
    p.add_argument("--markdown", help="write the tables here")
    p.add_argument("--cache", default=".cache/sm_check", help="result cache directory")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    p.add_argument("--no-dense", action="store_true", help="skip the dense TRITON_MLA path")
    p.add_argument("--fail-on-spills", action="store_true", help="register spills fail (default: warn)")
    p.add_argument("--tp", type=int, action="append", help="tensor parallel sizes to trace (default 1 2 4 8)")
    p.add_argument("--gguf-tp", type=int, action="append", help="TP sizes for the GGUF kernels (default 1 2 4 8)")
    p.add_argument(
        "--require-traced",
        action="append",
        default=[],
        metavar="MODULE",
        help="fail if a Triton kernel defined in MODULE was not launched by any scenario",
    )
    p.add_argument(
        "--cross", action="store_true", help="also compile the first target's launches for the other targets"
    )
    p.add_argument("--libs", metavar="SITE", help="also check vLLM's compiled libraries under SITE/vllm")
    p.add_argument("--override", action="append", default=[], help="KERNEL:NAME=INT[,...] (what-if)")
    args = p.parse_args(argv)
    args.target = args.target or ["sm_120", "sm_90"]
    for name in args.target:
        try:
            target(name)
        except ValueError as exc:
            p.error(str(exc))
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
