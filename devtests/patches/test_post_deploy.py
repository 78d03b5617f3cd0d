"""tests/test_patches.py (the post-deploy check) on the local host: a fresh manifest
passes, a stale one (a patched file changed after the manifest) fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from load_file import load_file
from sitecopy import INSTALLED, MODULE, PATCH_DIR, ROOT, make_site

testinfra = pytest.importorskip("testinfra")
pytestmark = pytest.mark.skipif(INSTALLED is None, reason="needs .venv-ml (pinned vLLM)")


def load_check() -> ModuleType:
    return load_file(ROOT / "tests/test_patches.py", "post_deploy_patches")


def test_fresh_passes_stale_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_site(tmp_path / "site")
    patches = tmp_path / "patches" / "vllm-0.20.2"
    shutil.copytree(PATCH_DIR, patches)
    args = {
        "site_packages": str(site),
        "patch_dir": str(patches),
        "patchset_version": "0.20.2",
        "python": sys.executable,
    }
    (tmp_path / "a.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    subprocess.run([sys.executable, str(MODULE), str(tmp_path / "a.json")], check=True, capture_output=True)
    check = load_check()
    monkeypatch.setattr(check, "PATCHES_DIR", str(tmp_path / "patches"))
    host = testinfra.get_host("local://")
    manifest = json.loads((site / "vllm/.glm5-patchset.json").read_text())
    check.test_manifest_names_installed_vllm(host, str(site), manifest)
    check.test_manifest_is_the_wheels_record(host, str(site), manifest)
    check.test_patched_files_match_manifest(host, str(site), manifest)
    check.test_patches_match_manifest(host, manifest)
    check.test_patches_still_applied(host, str(site), manifest)

    first = sorted(manifest["pristine"])[0]
    forged = {**manifest, "pristine": {**manifest["pristine"], first: "0" * 64}}
    with pytest.raises(AssertionError, match="is not vLLM's RECORD"):
        check.test_manifest_is_the_wheels_record(host, str(site), forged)

    edited = site / "vllm/model_executor/models/deepseek_v2.py"
    edited.write_text(edited.read_text() + "\n# edited after patching\n")
    with pytest.raises(AssertionError, match="differs from the manifest"):
        check.test_patched_files_match_manifest(host, str(site), manifest)
