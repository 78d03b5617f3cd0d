"""Stage results, the verdict table and the JSON report."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass
class StageResult:
    """One stage's verdict: the number it measured against its tolerance."""

    stage: int
    name: str
    verdict: Verdict
    measured: float | None
    tolerance: float | None
    where: str
    details: list[str] = field(default_factory=list)

    @classmethod
    def judge(
        cls,
        stage: int,
        name: str,
        measured: float,
        tolerance: float,
        where: str,
        details: list[str],
    ) -> StageResult:
        """pass when measured <= tolerance (a NaN measurement fails)."""
        ok = not math.isnan(measured) and measured <= tolerance
        return cls(stage, name, Verdict.PASS if ok else Verdict.FAIL, measured, tolerance,
                   where, details)

    @classmethod
    def skip(cls, stage: int, name: str, reason: str) -> StageResult:
        return cls(stage, name, Verdict.SKIP, None, None, "-", [reason])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        if self.measured is not None and math.isnan(self.measured):
            data["measured"] = "nan"
        return data


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or (1e-3 <= abs(value) < 1e4):
        return f"{value:.4g}"
    return f"{value:.3e}"


def render_table(results: list[StageResult], details: bool = True) -> str:
    """A plain-text verdict table, one row a stage, its details indented below."""
    header = ("stage", "name", "verdict", "measured", "tolerance", "where")
    rows = [
        (str(r.stage), r.name, r.verdict.value.upper(), _fmt(r.measured), _fmt(r.tolerance),
         r.where)
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    for result, row in zip(results, rows, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if details:
            lines.extend(f"      {d}" for d in result.details)
    first_fail = next((r for r in results if r.verdict is Verdict.FAIL), None)
    if first_fail is None:
        lines.append("verdict: no stage failed")
    else:
        lines.append(f"verdict: first failing stage is {first_fail.stage} ({first_fail.name})")
    return "\n".join(lines)


def write_json(results: list[StageResult], path: Path, meta: dict[str, Any]) -> None:
    failed = [r.stage for r in results if r.verdict is Verdict.FAIL]
    payload = {
        "meta": meta,
        "ok": not failed,
        "failed_stages": failed,
        "stages": [r.to_dict() for r in results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
