"""The check that the service account cannot write what root runs
(tests/test_python_env.py, writable_by) fails on a wrong layout and passes on the right
one, and role ml_env's tasks/ownership.yml turns the former into the latter, once.

A venv layout in the systemd test container (a versioned venv with bin/, a .pth file, a
vllm package, uv's tool venv), root's; then the layouts that must fail: a .pth file the
service account owns, a vLLM file group-writable by its group, a whole venv handed to it
(what role ml_env did before: chown -R vllm:vllm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ansible_runner
import pytest
import testinfra
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
VENV = "/opt/ml-envs/ml-env-0123456789ab"
SITE = f"{VENV}/lib/python3.13/site-packages"
LAYOUT = (
    f"id vllm >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin vllm; "
    f"rm -rf /opt/ml-envs /opt/glm5-uv; mkdir -p {VENV}/bin {SITE}/vllm /opt/glm5-uv/bin; "
    f"ln -s /usr/bin/python3 {VENV}/bin/python; echo 'import os' > {SITE}/glm5.pth; "
    f"echo '# vllm' > {SITE}/vllm/__init__.py; echo home > {VENV}/pyvenv.cfg; "
    f"echo '#!/bin/sh' > /opt/glm5-uv/bin/uv; chmod 0755 /opt/glm5-uv/bin/uv; "
    f"chown -R root:root /opt/ml-envs /opt/glm5-uv; chmod -R go-w /opt/ml-envs /opt/glm5-uv"
)


def _check_module():
    return load_file(ROOT / "tests/test_python_env.py", "glm5_test_python_env")


@pytest.fixture
def host(container: str):
    assert subprocess.run(["docker", "exec", container, "sh", "-c", LAYOUT]).returncode == 0
    return testinfra.get_host(f"docker://{container}")


def _sh(container: str, script: str) -> None:
    assert subprocess.run(["docker", "exec", container, "sh", "-c", script]).returncode == 0


def test_right_layout_passes(host):
    assert _check_module().writable_by(host, "vllm") == []


@pytest.mark.parametrize(
    ("fault", "listed"),
    [
        (f"chown vllm {SITE}/glm5.pth", [f"{SITE}/glm5.pth"]),
        (f"chgrp vllm {SITE}/vllm/__init__.py && chmod g+w {SITE}/vllm/__init__.py", [f"{SITE}/vllm/__init__.py"]),
        ("chmod o+w /opt/glm5-uv/bin", ["/opt/glm5-uv/bin"]),
        (f"chown -R vllm:vllm {VENV}", [VENV, f"{VENV}/bin", f"{VENV}/lib", f"{VENV}/lib/python3.13", SITE,
                                         f"{SITE}/vllm", f"{SITE}/vllm/__init__.py", f"{SITE}/glm5.pth",
                                         f"{VENV}/pyvenv.cfg"]),
    ],
    ids=["pth-owned-by-service", "vllm-file-group-writable", "uv-bin-world-writable", "venv-chowned-to-service"],
)
def test_wrong_layout_fails_naming_the_file(container, host, fault, listed):
    _sh(container, fault)
    found = _check_module().writable_by(host, "vllm")
    assert sorted(found) == sorted(listed)
    with pytest.raises(AssertionError):
        assert found == []


def _ownership(container: str, tmp: Path) -> list[dict]:
    play = ('[{"name": "ml_env ownership", "hosts": "all", "gather_facts": false, "tasks": [{"name": "ownership", '
            '"ansible.builtin.include_role": {"name": "ml_env", "tasks_from": "ownership"}}]}]')
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "play.yml").write_text(play)
    inventory = {"all": {"hosts": {container: {"ansible_connection": "community.docker.docker",
                                               "ansible_python_interpreter": "/usr/bin/python3"}}}}
    result = ansible_runner.run(
        private_data_dir=str(tmp), playbook=str(tmp / "play.yml"), inventory=inventory, quiet=True,
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                 "ANSIBLE_CACHE_PLUGIN": "memory",
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
    assert result.rc == 0, [e["event_data"].get("res") for e in result.events if e["event"] == "runner_on_failed"]
    return [e for e in result.events if e["event"] in ("runner_on_ok", "runner_on_skipped")]


def test_role_gives_a_handed_over_venv_back_to_root_once(container, host, tmp_path):
    _sh(container, f"chown -R vllm:vllm {VENV} && chmod g+w {SITE}/glm5.pth && chmod 0666 /opt/glm5-uv/bin/uv")
    assert _check_module().writable_by(host, "vllm")
    first = _ownership(container, tmp_path / "1")
    assert [e["event_data"]["task"] for e in first if e["event_data"].get("res", {}).get("changed")] == [
        "Give them to root and take the group's and others' write bits off"]
    assert _check_module().writable_by(host, "vllm") == []
    assert host.file(f"{SITE}/glm5.pth").user == "root" and host.file(VENV).group == "root"
    assert host.file(f"{VENV}/bin/python").is_symlink
    second = _ownership(container, tmp_path / "2")
    assert not [e for e in second if e["event_data"].get("res", {}).get("changed")]
