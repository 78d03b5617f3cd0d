"""Unit tests of the preflight role's free-space module."""

import os
from pathlib import Path

from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
mod = load_file(ROOT / "roles/preflight/library/free_space.py")


def test_nearest_existing_walks_up(tmp_path):
    (tmp_path / "a").mkdir()
    assert mod.nearest_existing(tmp_path / "a" / "b" / "c") == tmp_path / "a"
    assert mod.nearest_existing(tmp_path / "a") == tmp_path / "a"


def test_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    assert mod.nearest_existing(tmp_path / "f" / "g") == tmp_path


def test_measure_matches_statvfs(tmp_path):
    got = mod.measure(tmp_path / "not" / "yet")
    st = os.statvfs(tmp_path)
    assert got["checked"] == str(tmp_path)
    assert got["total_bytes"] == st.f_blocks * st.f_frsize
    assert 0 < got["free_bytes"] <= got["total_bytes"]
