"""The no-op shortcut: module glm5_host_state's snapshot sees every kind
of change under a root (content, mode, owner, rename, removal, a new entry, a link's
target, a content rewrite with the old mtime put back), keeps to its depth, walks a
nested root once, and the comparison with the record names what differs."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def tree(tmp_path):
    top = tmp_path / "etc"
    (top / "glm5").mkdir(parents=True)
    (top / "glm5" / "a.conf").write_text("a=1\n")
    (top / "glm5" / "b.conf").write_text("b=2\n")
    (top / "link").symlink_to("glm5/a.conf")
    return top


def _digest(hs, top, depth=-1):
    return hs.walk_root(str(top), depth, set())[0]


def _chown(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 4242, -1)


def _rewrite_keeping_mtime(path: Path) -> None:
    st = path.stat()
    path.write_text("a=9\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda t: (t / "glm5/a.conf").write_text("a=2\n"), id="content"),
        pytest.param(lambda t: _rewrite_keeping_mtime(t / "glm5/a.conf"), id="content-with-old-mtime"),
        pytest.param(lambda t: (t / "glm5/a.conf").chmod(0o600), id="mode"),
        pytest.param(lambda t: _chown(t / "glm5/a.conf"), id="owner"),
        pytest.param(lambda t: (t / "glm5/b.conf").rename(t / "glm5/c.conf"), id="rename"),
        pytest.param(lambda t: (t / "glm5/b.conf").unlink(), id="removal"),
        pytest.param(lambda t: (t / "glm5/new.conf").write_text(""), id="new-file"),
        pytest.param(lambda t: ((t / "link").unlink(), (t / "link").symlink_to("glm5/b.conf")), id="link-target"),
        pytest.param(lambda t: (t / "glm5").chmod(0o700), id="directory-mode"),
    ],
)
def test_every_change_under_a_root_shows(hs, tree, change):
    before = _digest(hs, tree)
    assert _digest(hs, tree) == before  # reading changes nothing
    change(tree)
    assert _digest(hs, tree) != before


def test_depth_limits_the_walk(hs, tree):
    shallow = _digest(hs, tree, depth=1)
    (tree / "glm5" / "a.conf").write_text("a=2\n")
    assert _digest(hs, tree, depth=1) == shallow  # a.conf is two levels down
    (tree / "top.conf").write_text("")
    assert _digest(hs, tree, depth=1) != shallow


def test_a_missing_root_is_recorded_as_missing(hs, tmp_path):
    missing = tmp_path / "nothing"
    digest, count = hs.walk_root(str(missing), -1, set())
    assert count == 0
    missing.mkdir()
    assert hs.walk_root(str(missing), -1, set())[0] != digest


def test_exclude_keeps_the_directory_but_not_its_entries(hs, tree):
    before = hs.walk_root(str(tree), -1, {str(tree / "glm5")})[0]
    (tree / "glm5" / "a.conf").write_text("a=3\n")
    assert hs.walk_root(str(tree), -1, {str(tree / "glm5")})[0] == before
    (tree / "glm5").chmod(0o700)
    assert hs.walk_root(str(tree), -1, {str(tree / "glm5")})[0] != before


def test_roots_are_normalized_and_nested_roots_walked_once(hs):
    roots = ["/etc", "/etc/glm5", {"path": "/usr/bin", "depth": 1}, "/usr/bin/python3", "/opt/", "/opt/ml-env",
             {"path": "/etc/", "depth": 0}]
    assert hs.normalize_roots(roots) == [("/etc", -1), ("/opt", -1), ("/usr/bin", 1), ("/usr/bin/python3", -1)]


def test_compare_names_what_differs(hs):
    inputs = {"settings": "s1", "project files": "p1"}
    parts = {"files:/etc": "e1", "units": "u1"}
    record = {"inputs": dict(inputs), "parts": dict(parts), "recorded_at": 1_000_000}
    assert hs.compare(record, inputs, parts, now=1_000_000) == []
    assert hs.compare(record, inputs, parts, max_age=3600, now=1_003_599) == []
    stale = "the record is older than {} s (or not dated)"
    assert hs.compare(record, inputs, parts, max_age=3600, now=1_003_601) == [stale.format(3600)]
    assert hs.compare({**record, "recorded_at": None}, inputs, parts) == [stale.format(86400)]
    record["recorded_at"] = time.time()
    assert hs.compare(None, inputs, parts) == ["no record of an earlier full run"]
    assert hs.compare(record, {**inputs, "settings": "s2"}, parts) == ["inputs: settings"]
    assert hs.compare(record, inputs, {**parts, "units": "u2"}) == ["units"]
    assert hs.compare(record, inputs, {**parts, "health": "h"}) == ["health: not in the record"]
    assert hs.compare(record, inputs, {"units": "u1"}) == ["files:/etc: no longer probed"]
    assert hs.compare({**record, "inputs": "old-format"}, inputs, parts) == [
        "inputs: project files", "inputs: settings"]


def test_record_is_roots_only_and_round_trips(hs, tmp_path):
    path = tmp_path / "run" / "record.json"
    hs.write_record(str(path), json.dumps({"inputs": {"settings": "x"}, "parts": {"units": "u"}}))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert hs.load_record(str(path)) == {"inputs": {"settings": "x"}, "parts": {"units": "u"}}
    path.write_text("not json")
    assert hs.load_record(str(path)) is None
    assert hs.load_record(str(tmp_path / "none.json")) is None


def test_snapshot_parts(hs, tree, monkeypatch):
    monkeypatch.setattr(hs, "units_state", lambda names: "units " + " ".join(names))
    params = {"roots": [str(tree), {"path": str(tree / "glm5"), "depth": 0}], "exclude": [], "units": ["x.service"],
              "commands": [["sh", "-c", "echo live"]], "health_url": ""}
    parts, entries = hs.snapshot(params)
    assert set(parts) == {f"files:{tree}", "units", "boot", "nvidia", "command:sh -c echo live"}
    assert entries == 4
    again, _ = hs.snapshot(params)
    assert again == parts
    params["commands"] = [["sh", "-c", "echo changed"]]
    assert hs.snapshot(params)[0]["command:sh -c echo changed"] != parts["command:sh -c echo live"]


def test_units_are_those_of_etc_systemd_system(hs, tmp_path, monkeypatch):
    unit_dir = tmp_path / "system"
    (unit_dir / "multi-user.target.wants").mkdir(parents=True)
    (unit_dir / "vllm-glm-5.service").write_text("[Unit]\n")
    (unit_dir / "multi-user.target.wants" / "nvidia-persistenced.service").symlink_to("/lib/x")
    (unit_dir / "nginx.service").symlink_to("/dev/null")  # masked
    (unit_dir / "README").write_text("")
    monkeypatch.setattr(hs, "UNIT_DIR", str(unit_dir))
    assert hs.deployment_units(["extra.service"]) == [
        "extra.service", "nginx.service", "nvidia-persistenced.service", "vllm-glm-5.service"]
