"""The repository speaks for itself: no file refers to an issue of a tracker its readers do
not have (the word issue and a number, or # and two digits). The reason such a number stood
for is written where it applies, or in docs/decisions/. Another project's issue is cited by
its address.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACKER = re.compile(r"\b[Ii]ssues?[ -]#?\d+|(?<![\w/])#\d{2,}\b")


def mentions(text: str) -> list[str]:
    return [m.group(0) for m in TRACKER.finditer(text)]


def candidate_lines() -> list[str]:
    """`path:line:text` of every tracked text file's line that may name an issue (git grep,
    in C; the exact pattern is applied here)."""
    try:
        proc = subprocess.run(
            ["git", "grep", "--untracked", "-n", "-I", "-i", "-E", "issue|#[0-9]{2}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
    except OSError:
        pytest.skip("git is not installed")
    if proc.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    return proc.stdout.decode("utf-8", "replace").splitlines()


def test_no_file_names_a_tracker_issue() -> None:
    lines = candidate_lines()
    assert any("tracker" in line for line in lines if line.startswith("devtests/docs/")), "git grep found nothing"
    found = [line[:200] for line in lines if mentions(line.split(":", 2)[2])]
    assert not found, "write the reason instead of the number:\n" + "\n".join(found)


def test_the_pattern_can_fail() -> None:
    # built from pieces, so that this file does not name an issue itself
    n = ["1" + "9", "5", "2" + "0", "1" + "4", "2" + "3"]
    text = f"the shortcut (issue {n[0]} item 6), Issue {n[1]}, issues {n[2]} and 21, the issue-{n[3]} evidence, #{n[4]}"
    assert mentions(text) == [f"issue {n[0]}", f"Issue {n[1]}", f"issues {n[2]}", f"issue-{n[3]}", f"#{n[4]}"]
    fine = "an issue with 3 GPUs; see https://github.com/NVIDIA/DCGM/issues/234; color #1; issued 2026"
    assert mentions(fine) == []
