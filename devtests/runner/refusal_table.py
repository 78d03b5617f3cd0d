"""Render the validation table's runs as the Markdown table of docs/validation-refusals.md.

Input: the JSON that devtests/runner/test_validation_phase.py writes with
GLM5_VALIDATE_TIMES=<file> ({row: {refusal_s, wall_s, overrides, lines}}). Output, on
stdout: one table line per refusal line (the row's run, the variable the line names, the
value it was given, the message, the seconds from the playbook's start to the refusal).

    python devtests/runner/refusal_table.py /tmp/times.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

# The test's secret marker never appears in the docs: a value holding it is shown as such.
SECRET_MARK = "sekrit-6d1f"
# "<variable> = ...", "<variable> (glm5_x) = ...", "<variable> is empty", "<variable> sets ...".
_NAMED = re.compile(r"^(?P<var>[a-z][a-z0-9_]*)(?: \((?P<shared>[a-z][a-z0-9_]*)\))?")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(value: Any) -> str:
    """The value as JSON, the test's secret as ***, a long value cut to its start and length."""
    shown = json.dumps(value).replace(SECRET_MARK, "***")
    if len(shown) > 60:
        shown = f"{shown[:20]}... ({len(shown)} characters)"
    return f"`{shown}`"


def line_variable(line: str, overrides: dict[str, Any]) -> tuple[str, str]:
    """(the variable the line names, the value the row gave it or the setting it comes from)."""
    match = _NAMED.match(line)
    if not match:
        return "", ""
    for name in (match["var"], match["shared"]):
        if name and name in overrides:
            return name, _value(overrides[name])
    # A role's variable that derives from the row's setting (named in parentheses) or a
    # value the line quotes itself.
    return match["var"], ""


def render(data: dict[str, dict[str, Any]]) -> str:
    out = ["| run | variable | value | message | seconds |", "| --- | --- | --- | --- | --- |"]
    for row, result in data.items():
        overrides = result["overrides"]
        for line in result["lines"]:
            var, value = line_variable(line, overrides)
            message = line.replace(SECRET_MARK, "***")
            out.append(f"| {row} | `{var}` | {_cell(value)} | {_cell(message)} | {result['refusal_s']} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(render(json.loads(Path(argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
