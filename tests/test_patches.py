"""Post-deploy check of the vLLM patch set (role vllm_patches).

Reads the manifest the role wrote into the venv
(<site-packages>/vllm/.glm5-patchset.json, or GLM5_PATCHSET_MANIFEST) and recomputes
on the host the sha256 of every patched file and of every patch: a stale manifest
(a vLLM reinstalled or a file edited after patching) fails; its pristine digests must
be those of vLLM's RECORD. Paths follow the roles'
defaults; GLM5_ML_ENV_PATH and GLM5_PATCHES_DIR override them.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os

import pytest

ML_ENV = os.environ.get("GLM5_ML_ENV_PATH", "/opt/ml-env")
PATCHES_DIR = os.environ.get("GLM5_PATCHES_DIR", "/opt/glm5/patches")


@pytest.fixture(scope="module")
def site(host) -> str:
    cmd = host.run(f"{ML_ENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'")
    assert cmd.rc == 0, cmd.stderr
    return str(cmd.stdout.strip())


@pytest.fixture(scope="module")
def manifest(host, site: str) -> dict:
    path = os.environ.get("GLM5_PATCHSET_MANIFEST", f"{site}/vllm/.glm5-patchset.json")
    manifest_file = host.file(path)
    assert manifest_file.exists, f"no patch set manifest at {path}"
    return dict(json.loads(manifest_file.content_string))


def test_manifest_names_installed_vllm(host, site: str, manifest: dict) -> None:
    dist = host.file(f"{site}/vllm-{manifest['vllm_version']}.dist-info")
    assert dist.is_directory, f"installed vLLM is not {manifest['vllm_version']}"
    assert manifest["patchset_version"] == manifest["vllm_version"]


def test_manifest_is_the_wheels_record(host, site: str, manifest: dict) -> None:
    """The manifest's pristine digests are the installed vLLM's RECORD (the wheel's
    files): what it vouches for was computed from the wheel and the patch set, not read
    from the tree."""
    record = host.file(f"{site}/vllm-{manifest['vllm_version']}.dist-info/RECORD").content_string
    digests = {}
    for row in csv.reader(io.StringIO(record)):
        if len(row) == 3 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256="):]
            digests[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    assert manifest.get("pristine"), "the manifest names no pristine digests"
    assert sorted(manifest["pristine"]) == sorted(manifest["files"])
    for rel, sha in manifest["pristine"].items():
        assert digests.get(rel) == sha, f"{rel}: the manifest's pristine digest is not vLLM's RECORD"


def test_patched_files_match_manifest(host, site: str, manifest: dict) -> None:
    assert manifest["files"], "manifest lists no patched files"
    for rel, sha in manifest["files"].items():
        assert host.file(f"{site}/{rel}").sha256sum == sha, f"{rel} differs from the manifest"


def test_patches_match_manifest(host, manifest: dict) -> None:
    assert manifest["patches"], "manifest lists no patches"
    base = f"{PATCHES_DIR}/vllm-{manifest['patchset_version']}"
    for name, sha in manifest["patches"].items():
        assert host.file(f"{base}/{name}").sha256sum == sha, f"{name} differs from the manifest"


def test_patches_still_applied(host, site: str, manifest: dict) -> None:
    """The patches reverse, newest first and in sequence, on a copy of the patched files:
    the tree really is the patched one. (One patch alone may not reverse on the tree
    when a later one changed lines of its context.)"""
    base = f"{PATCHES_DIR}/vllm-{manifest['patchset_version']}"
    tmp = host.run("mktemp -d").stdout.strip()
    assert tmp, "mktemp failed"
    try:
        for rel in manifest["files"]:
            assert host.run(f"mkdir -p {tmp}/$(dirname {rel}) && cp {site}/{rel} {tmp}/{rel}").rc == 0, rel
        for name in sorted(manifest["patches"], reverse=True):
            cmd = host.run(f"patch -p1 -R -s -f -d {tmp} -i {base}/{name}")
            assert cmd.rc == 0, f"{name} is not applied: {cmd.stdout}{cmd.stderr}"
    finally:
        host.run(f"rm -rf {tmp}")
