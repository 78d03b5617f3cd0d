"""The no-op shortcut: a deployed tree is checked in one round trip (module
glm5_tree_state against filter tree_manifest); each kind of drift makes it copy."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


@pytest.fixture()
def deployed(tmp_path, tree):
    src = ROOT / "files/patches/vllm-0.20.2"
    dest = tmp_path / "dest"
    shutil.copytree(src, dest)
    for p in dest.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return tree.tree_manifest(str(src)), dest


def _state(mod, dest, manifest, **over):
    args = {"mode": "0644", "owner": ME, "group": MY_GROUP, **over}
    return mod.tree_state(str(dest), manifest, args["mode"], args["owner"], args["group"])


def test_manifest_of_the_patch_set(tree):
    manifest = tree.tree_manifest(str(ROOT / "files/patches/vllm-0.20.2"))
    assert "0001-config-register-glm-moe-dsa.patch" in manifest
    assert all(len(v) == 64 for v in manifest.values())


def test_manifest_of_named_files(tree):
    manifest = tree.tree_manifest(str(ROOT / "src/glm5_tools"), ["__init__.py", "nccl_check/core.py"])
    assert sorted(manifest) == ["__init__.py", "nccl_check/core.py"]


@pytest.mark.parametrize("bad", ["../README.md", "/etc/passwd", "no_such.py"])
def test_manifest_refuses_what_is_not_a_file_inside(tree, bad):
    with pytest.raises(ValueError, match="is not a file inside"):
        tree.tree_manifest(str(ROOT / "src/glm5_tools"), [bad])


def test_in_sync(tree_state, deployed):
    manifest, dest = deployed
    assert _state(tree_state, dest, manifest) == {"in_sync": True, "differ": []}
    (dest / "extra.txt").write_text("not ours")  # copy leaves extra files alone, so does the check
    assert _state(tree_state, dest, manifest)["in_sync"] is True


def test_each_drift_is_named(tree_state, deployed):
    manifest, dest = deployed
    names = sorted(manifest)
    (dest / names[0]).write_text("edited on the host\n")
    (dest / names[1]).chmod(0o600)
    (dest / names[2]).unlink()
    (dest / names[3]).unlink()
    (dest / names[3]).symlink_to(dest / names[4])
    result = _state(tree_state, dest, manifest)
    assert result["in_sync"] is False
    assert result["differ"] == [
        f"{names[0]}: content",
        f"{names[1]}: mode 0600",
        f"{names[2]}: missing",
        f"{names[3]}: not a regular file",
    ]


def test_owner_and_group(tree_state, deployed):
    manifest, dest = deployed
    result = _state(tree_state, dest, manifest, owner="glm5-nobody", group="glm5-nogroup")
    assert result["in_sync"] is False
    assert all(f"owner {ME}" in d and f"group {MY_GROUP}" in d for d in result["differ"])


def test_missing_tree_and_bad_mode(tree_state, deployed, tmp_path):
    manifest, _ = deployed
    assert _state(tree_state, tmp_path / "absent", manifest)["in_sync"] is False
    with pytest.raises(ValueError, match="octal"):
        _state(tree_state, tmp_path, manifest, mode="rw-r--r--")
