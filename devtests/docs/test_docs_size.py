"""docs/ holds summaries (card, date, command, one results file per topic), not run debris:
the tracked files under docs/ stay within 1 MiB together. A run's logs and arrays stay in
git history or in a compact results file beside its summary.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1_048_576  # bytes, summed over the tracked files under docs/


def tracked_docs(root: Path = ROOT) -> list[Path]:
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--", "docs"], cwd=root, capture_output=True, check=False)
    except OSError:
        pytest.skip("git is not installed")
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    names = [n for n in proc.stdout.decode("utf-8", "replace").split("\0") if n]
    return [root / n for n in names]


def total_bytes(paths: list[Path]) -> int:
    # a tracked file deleted in the working tree counts as gone
    return sum(p.stat().st_size for p in paths if p.is_file())


def largest(paths: list[Path], n: int = 10) -> list[str]:
    sized = sorted(((p.stat().st_size, p) for p in paths if p.is_file()), reverse=True)
    return [f"{size:>9,} {p.relative_to(ROOT)}" for size, p in sized[:n]]


def test_docs_stay_within_one_mebibyte() -> None:
    paths = tracked_docs()
    assert len(paths) > 20, f"git ls-files found only {paths}"
    total = total_bytes(paths)
    assert total <= LIMIT, (
        f"docs/ is {total:,} bytes, over {LIMIT:,}: keep summaries, compact results files, "
        "and leave run debris to git history. Largest:\n" + "\n".join(largest(paths))
    )


def test_the_sum_counts_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes(b"x" * 600_000)
    (tmp_path / "b.json").write_bytes(b"y" * 448_577)
    paths = [tmp_path / "a.md", tmp_path / "b.json", tmp_path / "deleted.md"]
    assert total_bytes(paths) == LIMIT + 1
    assert total_bytes(paths[:1]) <= LIMIT
