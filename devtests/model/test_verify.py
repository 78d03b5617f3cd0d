"""Module glm5_model_verify (role model): sizes and sha256 against the manifests, the stat
cache of verified hashes keyed by (size, mtime, ctime, inode, device), the progress file,
and what it does with a file that differs (refuse it naming the file, or remove it for a
second fetch). Through Ansible (ad hoc) where the module's whole path matters, in-process
for the pure functions."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from adhoc import call_module, run_module
from load_file import load_role_module

verify_mod = load_role_module("roles/model/library/glm5_model_verify.py")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Model:
    """A model directory with two shards and a SHA256SUMS manifest, and the module's paths."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "model"
        self.state = tmp / "state"
        (self.root / "gguf").mkdir(parents=True)
        self.state.mkdir()
        self.shards = [self.root / "gguf" / f"GLM-5-UD-Q4_K_XL-0000{i}-of-00002.gguf" for i in (1, 2)]
        for i, shard in enumerate(self.shards):
            shard.write_bytes(os.urandom((1 << 16) + i))
        self.manifest = tmp / "SHA256SUMS"
        self.write_manifest()
        self.cache = self.state / "verified.json"
        self.progress = self.state / "verify-progress.json"

    def write_manifest(self) -> None:
        self.manifest.write_text("".join(f"{_sha(s.read_bytes())}  gguf/{s.name}\n" for s in self.shards))

    def args(self, **more: Any) -> dict[str, Any]:
        return {"manifests": [{"path": str(self.manifest), "root": str(self.root)}], "cache": str(self.cache),
                "progress": str(self.progress), "interval": 0.2, **more}

    def run(self, check: bool = False, ansible: bool = False, **more: Any) -> dict[str, Any]:
        """The module's result: through Ansible (ad hoc, seconds) or its main() in-process."""
        if ansible:
            return run_module("model", "glm5_model_verify", self.args(**more), check=check)
        return call_module(verify_mod, self.args(**more), check=check)

    def cached(self) -> dict[str, Any]:
        files: dict[str, Any] = json.loads(self.cache.read_text())["files"]
        return files


def _flip(path: Path) -> None:
    """One byte flipped in place, the size, mtime and atime put back (ctime cannot be)."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(st.st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.fixture
def model(tmp_path: Path) -> Model:
    return Model(tmp_path)


def test_flipped_byte_with_size_and_mtime_put_back_is_hashed_again_and_refused(model: Model) -> None:
    first = model.run(ansible=True)
    assert not first.get("failed") and first["changed"], first
    before = model.cached()
    _flip(model.shards[1])
    manifest_before = (model.manifest.read_bytes(), model.manifest.stat().st_mtime_ns)
    again = model.run(ansible=True)
    assert again.get("failed"), "a shard that differs from the manifest passed the verification"
    assert f"{model.shards[1]}: sha256 " in again["msg"] and "the manifest says" in again["msg"]
    assert again["hashed"] == [str(model.shards[1])], "only the file whose stat changed is hashed again"
    # The cache keeps the other shard and no longer vouches for the flipped one; the
    # manifest is never rewritten from the disk.
    shard0 = str(model.shards[0])
    assert set(model.cached()) == {shard0} and model.cached()[shard0] == before[shard0]
    assert (model.manifest.read_bytes(), model.manifest.stat().st_mtime_ns) == manifest_before
    # And it stays refused: a failed check leaves no record that a later run could trust.
    assert model.run().get("failed")


def test_unchanged_stat_is_not_hashed_and_says_so_in_one_line(model: Model) -> None:
    assert model.run()["changed"]
    quick = model.run(only_cached=True)
    assert not quick["changed"] and quick["to_hash"] == []
    assert quick["line"].startswith("all 2 files (") and "unchanged since their last verified hash" in quick["line"]
    again = model.run()
    assert not again["changed"] and again["hashed"] == [] and again["cached"] == 2


@pytest.mark.parametrize("change", ["chmod", "same_bytes_new_inode", "touch"])
def test_any_stat_change_means_hashing_again(model: Model, change: str) -> None:
    assert model.run()["changed"]
    shard = model.shards[0]
    st = shard.stat()
    if change == "chmod":
        shard.chmod(0o600)
        shard.chmod(st.st_mode & 0o777)  # mode as before: only the ctime tells
    elif change == "same_bytes_new_inode":
        copy = shard.with_suffix(".new")
        shutil.copy2(shard, copy)
        copy.replace(shard)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    quick = model.run(only_cached=True)
    assert quick["to_hash"] == [str(shard)]
    again = model.run()
    assert not again.get("failed") and again["hashed"] == [str(shard)] and again["changed"]


def test_remove_mode_removes_what_differs_and_keeps_no_record_of_it(model: Model) -> None:
    model.run()
    _flip(model.shards[0])
    model.shards[1].write_bytes(b"short")  # the wrong size
    got = model.run(on_mismatch="remove")
    assert not got.get("failed") and got["changed"]
    assert sorted(got["removed"]) == sorted(str(s) for s in model.shards)
    assert not any(s.exists() for s in model.shards)
    assert model.cached() == {}
    missing = model.run()
    assert missing.get("failed") and "missing" in missing["msg"]


def test_cache_is_root_only_written_only_after_a_match_and_not_in_check_mode(model: Model) -> None:
    _flip(model.shards[1])
    checked = model.run(check=True)
    assert checked.get("failed") and not model.cache.exists()
    bad = model.run()
    assert bad.get("failed")
    assert set(model.cached()) == {str(model.shards[0])}
    assert model.cache.stat().st_mode & 0o777 == 0o600
    model.cache.unlink()
    model.write_manifest()  # a manifest that vouches for the file as it is now
    assert model.run(check=True)["changed"] and not model.cache.exists()
    assert model.run()["changed"] and len(model.cached()) == 2


def test_hint_and_every_file_named_in_a_refusal(model: Model) -> None:
    for shard in model.shards:
        _flip(shard)
    got = model.run(hint="Remove it and run again.")
    assert got.get("failed")
    assert all(str(s) in got["msg"] for s in model.shards) and got["msg"].endswith("Remove it and run again.")


def test_progress_file_while_hashing(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[dict[str, Any]] = []
    progress = verify_mod.Progress(str(model.progress), 0.0, 2, 3 * (1 << 16), 1)
    monkeypatch.setattr(verify_mod, "CHUNK", 1 << 14)
    monkeypatch.setattr(verify_mod, "write_atomic", lambda path, doc: written.append(json.loads(json.dumps(doc))))
    progress.interval = 0.0
    progress.doc["current"] = [{"path": "gguf/a", "bytes": 0, "size": 1 << 16}]
    assert verify_mod.sha256_file(model.shards[0], progress) == _sha(model.shards[0].read_bytes())
    assert len(written) >= 4
    assert [d["bytes_done"] for d in written] == sorted(d["bytes_done"] for d in written)
    last = written[-1]
    assert last["bytes_done"] == 1 << 16 and last["current"][0]["bytes"] == 1 << 16
    line = verify_mod.describe(last)
    assert line.startswith("sha256: 0 of 2 files, 65.5 kB of 196.6 kB (33 %), ")
    assert "; now gguf/a (65.5 kB of 65.5 kB)" in line
    assert "(1 more file unchanged since the last verified hash: not hashed again)" in line


def test_manifest_formats() -> None:
    sums = verify_mod.parse_manifest("abc  gguf/a.gguf\n# c\ndef *base/config.json\n")
    assert sums == [{"path": "gguf/a.gguf", "size": None, "sha256": "abc"},
                    {"path": "base/config.json", "size": None, "sha256": "def"}]
    js = verify_mod.parse_manifest(json.dumps([{"path": "x", "size": 3, "sha256": None}]))
    assert js == [{"path": "x", "size": 3, "sha256": None}]


def test_paths_that_leave_the_root_are_refused(tmp_path: Path) -> None:
    errors, *_ = verify_mod.plan([(tmp_path, "../etc/passwd", {"size": 1, "sha256": None})], {}, "fail")
    assert errors and "leaves" in errors[0]
