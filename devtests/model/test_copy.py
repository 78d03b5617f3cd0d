"""Module glm5_model_copy (role model's local source): the files the manifest lists,
copied where missing or different in size or mtime, with the source's mtime and the
given owner and mode, and a progress document while it copies."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
from pathlib import Path
from typing import Any

from adhoc import call_module
from load_file import load_role_module

copy_mod = load_role_module("roles/model/library/glm5_model_copy.py")
OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def _source(tmp: Path) -> Path:
    src = tmp / "src"
    (src / "gguf" / "Q").mkdir(parents=True)
    (src / "base").mkdir()
    (src / "gguf" / "Q" / "a-00001-of-00002.gguf").write_bytes(os.urandom(3 << 20))
    (src / "gguf" / "Q" / "a-00002-of-00002.gguf").write_bytes(os.urandom(1 << 20))
    (src / "base" / "config.json").write_text("{}\n")
    (src / "README.md").write_text("not in the manifest\n")
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(src)}\n"
             for p in sorted(src.rglob("*")) if p.is_file() and p.name != "README.md"]
    (src / "SHA256SUMS").write_text("".join(lines))
    return src


def _run(src: Path, dest: Path, **more: Any) -> dict[str, Any]:
    return call_module(copy_mod, {"src": str(src), "dest": str(dest), "manifest": str(src / "SHA256SUMS"),
                                  "owner": OWNER, "group": GROUP, "interval": 0.0, **more})


def test_copies_what_the_manifest_lists_once(tmp_path: Path) -> None:
    src, dest = _source(tmp_path), tmp_path / "dest"
    dest.mkdir()
    plan = _run(src, dest, plan_only=True)
    assert not plan["changed"] and len(plan["to_copy"]) == 3 and plan["line"].startswith("3 files of 3 to copy")
    assert not (dest / "gguf").exists()
    progress = tmp_path / "progress.json"
    got = _run(src, dest, progress=str(progress))
    assert got["changed"] and sorted(got["copied"]) == sorted(plan["to_copy"])
    for rel in got["copied"]:
        s, d = (src / rel).stat(), (dest / rel).stat()
        assert (d.st_size, d.st_mtime_ns, d.st_mode & 0o777) == (s.st_size, s.st_mtime_ns, 0o640)
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    assert (dest / "gguf" / "Q").stat().st_mode & 0o777 == 0o750
    assert not (dest / "README.md").exists() and not list(dest.rglob("*.glm5-copy"))
    doc = json.loads(progress.read_text())
    assert doc["done"] and doc["files_done"] == 3 and doc["bytes_done"] == doc["bytes_total"] == (4 << 20) + 3
    again = _run(src, dest)
    assert not again["changed"] and again["to_copy"] == [] and again["line"] == "all 3 files in place already"


def test_copies_again_what_differs_in_size_or_mtime_and_nothing_in_check_mode(tmp_path: Path) -> None:
    src, dest = _source(tmp_path), tmp_path / "dest"
    dest.mkdir()
    _run(src, dest)
    shard = dest / "gguf" / "Q" / "a-00002-of-00002.gguf"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (dest / "base" / "config.json").write_text("{}\n\n")
    checked = call_module(copy_mod, {"src": str(src), "dest": str(dest), "manifest": str(src / "SHA256SUMS"),
                                     "owner": OWNER, "group": GROUP}, check=True)
    assert checked["changed"] and sorted(checked["to_copy"]) == ["base/config.json", "gguf/Q/a-00002-of-00002.gguf"]
    assert (dest / "base" / "config.json").read_text() == "{}\n\n"
    got = _run(src, dest)
    assert sorted(got["copied"]) == ["base/config.json", "gguf/Q/a-00002-of-00002.gguf"]
    assert (dest / "base" / "config.json").read_text() == "{}\n"


def test_refuses_a_manifest_naming_missing_or_escaping_files(tmp_path: Path) -> None:
    src, dest = _source(tmp_path), tmp_path / "dest"
    dest.mkdir()
    with (src / "SHA256SUMS").open("a") as fh:
        fh.write(f"{'0' * 64}  gguf/Q/gone.gguf\n{'0' * 64}  ../etc/passwd\n")
    got = _run(src, dest)
    assert got["failed"] and "../etc/passwd: path leaves the directory" in got["msg"]
    assert f"{src}/gguf/Q/gone.gguf: missing" in got["msg"]
    assert not (dest / "gguf").exists()
