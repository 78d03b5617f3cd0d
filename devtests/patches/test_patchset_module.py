"""The glm5_vllm_patchset module against copies of the real pinned vLLM files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sitecopy import INSTALLED, MODULE, PATCH_DIR, make_site, pristine, snapshot, targets

pytestmark = pytest.mark.skipif(INSTALLED is None, reason="needs .venv-ml (pinned vLLM)")


def module(tmp_path: Path, site: Path, **params: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "site_packages": str(site),
        "patch_dir": str(PATCH_DIR),
        "patchset_version": "0.20.2",
        "python": sys.executable,
    }
    args.update(params)
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE), str(argfile)], capture_output=True, text=True, check=False)
    return dict(json.loads(proc.stdout))


def test_applies_detects_and_reverses(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    first = module(tmp_path, site)
    assert first["changed"] and len(first["applied"]) == len(list(PATCH_DIR.glob("*.patch"))), first
    assert not pristine(site)
    manifest = json.loads((site / "vllm" / ".glm5-patchset.json").read_text())
    assert manifest["patchset_version"] == manifest["vllm_version"] == "0.20.2"
    assert sorted(manifest["files"]) == targets()
    assert sorted(manifest["patches"]) == sorted(p.name for p in PATCH_DIR.glob("*.patch"))
    for rel in targets():  # byte-compiled by the venv's python
        pyc = list((site / rel).parent.glob(f"__pycache__/{Path(rel).stem}.*.pyc"))
        assert pyc, rel

    again = module(tmp_path, site)
    assert again["changed"] is False and again["applied"] == []

    check = module(tmp_path, site, state="absent", _ansible_check_mode=True)
    assert check["changed"] and not pristine(site)

    gone = module(tmp_path, site, state="absent")
    assert gone["changed"] and pristine(site)
    assert not (site / "vllm" / ".glm5-patchset.json").exists()
    assert module(tmp_path, site, state="absent")["changed"] is False


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    before = snapshot(site)
    result = module(tmp_path, site, _ansible_check_mode=True)
    assert result["changed"] and snapshot(site) == before


def test_stale_manifest_is_rewritten(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    path = site / "vllm" / ".glm5-patchset.json"
    path.write_text('{"patchset_version": "old"}')
    result = module(tmp_path, site)
    assert result["changed"] and result["applied"] == []
    assert json.loads(path.read_text())["patchset_version"] == "0.20.2"


def test_reinstalled_tree_is_patched_again(tmp_path: Path) -> None:
    """A vLLM reinstall leaves pristine files under a stale manifest."""
    site = make_site(tmp_path / "site")
    module(tmp_path, site)
    for rel in targets():
        (site / rel).write_bytes((INSTALLED / rel).read_bytes())  # type: ignore[operator]
    result = module(tmp_path, site)
    assert result["changed"] and len(result["applied"]) == len(list(PATCH_DIR.glob("*.patch"))) and not pristine(site)


def test_wrong_version_refused_untouched(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", version="0.20.1")
    before = snapshot(site)
    result = module(tmp_path, site)
    assert result.get("failed")
    assert "0.20.1" in result["msg"] and "0.20.2" in result["msg"]
    assert snapshot(site) == before


def test_conflict_leaves_no_half_patched_tree(tmp_path: Path) -> None:
    """Patch 0004 cannot apply: the patches before it must not be applied either."""
    site = make_site(tmp_path / "site")
    last = site / targets()[-1]
    deepseek = site / "vllm/model_executor/models/deepseek_v2.py"
    text = deepseek.read_text()
    deepseek.write_text(text.replace('self.is_v32 = hasattr(config, "index_topk")', "X = 1"))
    before = snapshot(site)
    result = module(tmp_path, site)
    assert result.get("failed") and "0004" in result["msg"], result
    assert snapshot(site) == before
    assert last.exists()
