"""Bad input is refused by the roles' validation, before any change, naming the choices.

Runs only the validation entry points (tasks_from validate.yml: facts and asserts,
no change) with ansible-playbook against localhost.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = """---
- hosts: localhost
  connection: local
  gather_facts: true
  tasks:
    - ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: validate.yml
    - ansible.builtin.include_role:
        name: cuda_toolkit
        tasks_from: validate.yml
"""

ANSIBLE = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")
pytestmark = pytest.mark.skipif(ANSIBLE is None, reason="ansible-playbook not installed")


def run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "validate.yml"
    book.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    return subprocess.run(
        [
            str(ANSIBLE),
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(book),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_defaults_pass(tmp_path):
    res = run(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "changed=0" in res.stdout


def test_unknown_branch_refused_naming_choices(tmp_path):
    res = run(tmp_path, "-e", "glm5_nvidia_driver_branch=999")
    assert res.returncode != 0
    out = " ".join(res.stdout.split())  # the yaml callback wraps long messages
    assert "nvidia_driver_branch (glm5_nvidia_driver_branch) = ''999'' is refused" in out
    assert "expected one of 570, 575, 580." in out


def test_branch_590_refused_for_its_unversioned_package_names(tmp_path):
    """From 590 NVIDIA drops the branch from the package names
    (nvidia-open, libnvidia-compute, nvidia-dkms-open) and selects the branch only with
    nvidia-driver-pinning-590; the role's per-branch names and holds do not exist there.
    Failed first: 590 was in the known branches and passed validation (rc 0)."""
    res = run(tmp_path, "-e", "glm5_nvidia_driver_branch=590")
    assert res.returncode != 0, res.stdout
    out = " ".join(res.stdout.split())  # the yaml callback wraps long messages
    assert ("nvidia_driver_branch (glm5_nvidia_driver_branch) = ''590'' is refused:"
            " from 590 on NVIDIA names its packages") in out
    assert "expected one of 570, 575, 580." in out
    assert "nvidia-driver-pinning-590" in out
    assert "changed=" not in res.stdout.split("PLAY RECAP")[0]


def test_cuda_the_branch_cannot_run_refused_naming_three_versions(tmp_path):
    res = run(tmp_path, "-e", "glm5_nvidia_driver_branch=570")
    assert res.returncode != 0
    out = res.stdout
    out = " ".join(out.split())  # the yaml callback wraps long messages
    # One line, about the branch (the toolkit follows torch's CUDA; cuda_toolkit_version was not set).
    assert ("cuda_toolkit_driver_branch (glm5_nvidia_driver_branch) = ''570'' is refused: CUDA toolkit 13.0 needs"
            " driver branch 580 or newer; torch''s CUDA 13.0 needs driver branch 580 or newer; expected driver branch"
            " 580 or newer.") in out
    assert "cuda_toolkit_version" not in out.split("PLAY RECAP")[0]


def test_toolkit_major_differing_from_torch_refused(tmp_path):
    res = run(tmp_path, "-e", "cuda_toolkit_version=12.8")
    assert res.returncode != 0
    assert "differs from torch's CUDA major 13" in res.stdout


def test_bad_reboot_mode_refused(tmp_path):
    res = run(tmp_path, "-e", "nvidia_driver_reboot=sometimes")
    assert res.returncode != 0
    # Refused by meta/argument_specs.yml (choices), collected like the other checks.
    assert "msg: nvidia_driver_reboot = 'sometimes' is refused; expected one of auto, never." in res.stdout
    # Only what failed: the branch and the other options are fine, and not named.
    assert "nvidia_driver_branch" not in res.stdout.split("PLAY RECAP")[0]
