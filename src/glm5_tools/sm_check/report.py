"""Verdicts against a target's limits, and the tables."""

from __future__ import annotations

from collections import defaultdict

from .compile import KernelResult
from .targets import Target


def problems(result: KernelResult, target: Target, *, spills_fail: bool = False) -> list[str]:
    """Why result cannot run on target; empty when it fits. Register spills are a
    speed matter, not a fit: a problem only with spills_fail (else see warnings)."""
    name = f"{result.name} [{result.launch}] on {target.name}"
    if result.error:
        return [f"{name}: does not compile: {result.error}"]
    out = []
    if result.shared > target.smem_per_block:
        out.append(
            f"{name}: needs {result.shared} bytes of shared memory per block, "
            f"{target.name} allows {target.smem_per_block}"
        )
    threads = result.num_warps * 32
    if result.regs > target.max_regs_per_thread or result.regs * threads > target.regs_per_sm:
        out.append(
            f"{name}: {result.regs} registers x {threads} threads = {result.regs * threads} > "
            f"{target.regs_per_sm} registers per SM (or > {target.max_regs_per_thread} per thread)"
        )
    if spills_fail:
        out += warnings(result, target)
    if result.forbidden:
        out.append(f"{name}: SASS has {', '.join(result.forbidden)}, not for {target.name}")
    return out


def warnings(result: KernelResult, target: Target) -> list[str]:
    """Register spills (local memory traffic): the kernel runs, slower."""
    if result.error or not (result.spill_stores or result.spill_loads):
        return []
    return [
        f"{result.name} [{result.launch}] on {target.name}: spills registers "
        f"({result.spill_stores} bytes stored, {result.spill_loads} bytes loaded)"
    ]


def markdown(results: list[KernelResult], targets: list[Target]) -> str:
    """A summary per kernel, then one row per launch configuration: each target's
    numbers for the configurations that target launches ("-": not launched there)."""
    rows: dict[tuple[str, str], dict[str, KernelResult]] = defaultdict(dict)
    for r in results:
        rows[(r.kernel, r.launch)][r.target] = r
    by_target = {t.name: t for t in targets}
    names = [t.name for t in targets]
    head = ["kernel", "module", "configurations"]
    head += [f"max smem {n} (B)" for n in names] + [f"max regs {n}" for n in names]
    head += ["spills", "verdict"]
    kernels: dict[str, list[KernelResult]] = defaultdict(list)
    for r in results:
        kernels[r.kernel].append(r)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kernel, rs in sorted(kernels.items()):
        module, _, name = kernel.rpartition(":")
        cells = [f"`{name}`", f"`{module}`", str(len({r.launch for r in rs}))]
        for attr in ("shared", "regs"):
            for n in names:
                mine = [getattr(r, attr) for r in rs if r.target == n and not r.error]
                cells.append(str(max(mine)) if mine else "-")
        cells.append(str(sum(r.spill_stores + r.spill_loads for r in rs)))
        bad = [p for r in rs for p in problems(r, by_target[r.target])]
        spills = [w for r in rs for w in warnings(r, by_target[r.target])]
        cells.append(f"FAIL ({len(bad)})" if bad else "ok, spills" if spills else "ok")
        lines.append("| " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""]
    head = ["kernel", "launch config (constexprs, num_warps, num_stages)", "scenarios"]
    head += [f"smem {n} (B)" for n in names] + [f"regs {n}" for n in names]
    head += ["spills (st/ld B)", "MMA", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (kernel, launch), by in sorted(rows.items()):
        first = next(iter(by.values()))
        cells = [f"`{kernel.rsplit(':', 1)[-1]}`", launch, _short(first.scenario)]
        cells += [_num(by.get(n), "shared") for n in names]
        cells += [_num(by.get(n), "regs") for n in names]
        cells.append(" ".join(f"{n}:{r.spill_stores}/{r.spill_loads}" for n, r in by.items()))
        cells.append(" ".join(sorted({m for r in by.values() for m in r.mma})) or "-")
        verdicts = []
        for n, r in by.items():
            bad = problems(r, by_target[n])
            spill = " (spills)" if warnings(r, by_target[n]) else ""
            verdicts.append(f"{n} FAIL: " + "; ".join(bad) if bad else f"{n} ok{spill}")
        cells.append(", ".join(verdicts))
        lines.append("| " + " | ".join(cells) + " |")
    out.append("\n".join(lines))
    return "\n".join(out) + "\n"


def _num(r: KernelResult | None, attr: str) -> str:
    if r is None:
        return "-"
    if r.error:
        return "error"
    return str(getattr(r, attr))


def _short(scenarios: str, most: int = 3) -> str:
    parts = scenarios.split(", ")
    return ", ".join(parts[:most]) + (f" (+{len(parts) - most} more)" if len(parts) > most else "")
