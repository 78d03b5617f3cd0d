"""Role vllm_patches through ansible-runner against localhost, on copies of the real files.

Wrong version: refused, naming both versions, site-packages byte-identical after.
Right version: applied, second run changed=0, absent restores the pristine files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from sitecopy import INSTALLED, ROOT, make_site, pristine, snapshot

ansible_runner = pytest.importorskip("ansible_runner")
pytestmark = pytest.mark.skipif(INSTALLED is None, reason="needs .venv-ml (pinned vLLM)")

PLAY = """---
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: vllm_patches
"""


def converge(tmp_path: Path, site: Path, **extra: Any) -> Any:
    data = tmp_path / "runner"
    (data / "project").mkdir(parents=True, exist_ok=True)
    (data / "project" / "play.yml").write_text(PLAY)
    extravars: dict[str, Any] = {
        "vllm_patches_site_packages": str(site),
        "vllm_patches_python": sys.executable,
        "vllm_patches_dir": str(tmp_path / "patches"),
        "vllm_patches_install_tool": False,
        "ansible_python_interpreter": sys.executable,
    }
    extravars.update(extra)
    return ansible_runner.run(
        private_data_dir=str(data),
        playbook="play.yml",
        inventory="localhost ansible_connection=local",
        extravars=extravars,
        envvars={
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        },
        quiet=True,
    )


def changed(run: Any) -> int:
    return int(run.stats["changed"].get("localhost", 0))


def test_wrong_version_refused_untouched(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", version="0.20.1")
    before = snapshot(site)
    run = converge(tmp_path, site)
    assert run.rc != 0
    out = run.stdout.read()
    assert "0.20.1" in out and "0.20.2" in out and "Nothing was changed" in out
    assert snapshot(site) == before
    assert not (tmp_path / "patches").exists()


def test_apply_idempotent_absent(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    first = converge(tmp_path, site)
    assert first.rc == 0 and changed(first) > 0 and not pristine(site)
    second = converge(tmp_path, site)
    assert second.rc == 0 and changed(second) == 0
    check = converge(tmp_path, site, ansible_check_mode=True)
    assert check.rc == 0
    gone = converge(tmp_path, site, vllm_patches_state="absent")
    assert gone.rc == 0 and changed(gone) > 0 and pristine(site)
    assert not (site / "vllm" / ".glm5-patchset.json").exists()
