"""A systemd test container of the molecule test image, and ansible-runner driving the
repository's playbooks against it (shared by devtests/runner's modules)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from runner_events import Run

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("MOLECULE_IMAGE", "glm5-test/debian13-systemd:1")
# The readiness wait of role glm5's tasks/unit_wait.yml (one task looping over its rounds).
WAIT_ROUND = "Wait for the service to answer, a line a round (fails at once when it crashes)"


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True)


def start_container(prefix: str, volumes: Sequence[str] = ()) -> Iterator[str]:
    """A fresh systemd container of the test image, removed afterwards; volumes:
    docker's -v arguments (host:container[:mode])."""
    if shutil.which("docker") is None or subprocess.run(
        ["docker", "image", "inspect", IMAGE], capture_output=True
    ).returncode:
        pytest.skip(f"needs Docker and the test image {IMAGE} (molecule/image/build.sh)")
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    _docker(
        "run", "-d", "--name", name, "--cap-add", "SYS_ADMIN",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs", "/run", "--tmpfs", "/run/lock",
        # The kernel's default privileged port range, as on a real host (Docker opens it
        # to every port inside a container: ports below 1024 must be refused here too).
        "--sysctl", "net.ipv4.ip_unprivileged_port_start=1024",
        *(a for v in volumes for a in ("-v", v)), IMAGE, "/sbin/init",
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["docker", "exec", name, "systemctl", "is-system-running"],
                capture_output=True, text=True,
            ).stdout.strip()
            if state in {"running", "degraded"}:
                break
            time.sleep(1)
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def crash_times(container: str, unit: str) -> list[float]:
    """When ``unit``'s main process exited (systemd's 'Main process exited' lines), epoch
    seconds, oldest first; at least one."""
    found = subprocess.run(["docker", "exec", container, "journalctl", "-u", unit, "-o", "short-unix", "--no-pager",
                            "--grep", "Main process exited"], capture_output=True, text=True).stdout
    stamps = [float(s) for s in re.findall(r"^(\d+\.\d+) ", found, re.MULTILINE)]
    assert stamps, f"no crash in {unit}'s journal: {found!r}"
    return stamps


def ansible_env() -> dict[str, str]:
    """The environment every playbook run of these tests gets (ansible-runner's envvars,
    or added to os.environ for an ansible-playbook started directly)."""
    return {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        # No facts cached from one container for the next one of the same name.
        "ANSIBLE_CACHE_PLUGIN": "memory",
        # One `docker exec` per task instead of four (the docker connection pipelines).
        "ANSIBLE_PIPELINING": "true",
        # ansible-playbook from the same venv as this pytest.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def inventory_of(container: str) -> dict[str, Any]:
    """``container`` as the one host of group gpu_servers, reached through docker exec."""
    return {"all": {"children": {"gpu_servers": {"hosts": {container: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}}}}


def start_playbook(container: str, private: Path, playbook: str, extravars: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A playbook of the repository against ``container`` as a plain ansible-playbook in a
    session of its own, not waited for: a test kills its whole process group
    (os.killpg) as a SIGKILLed run would die. Its vars and inventory go to ``private``."""
    private.mkdir(parents=True)
    (private / "vars.json").write_text(json.dumps(extravars))
    (private / "inventory.json").write_text(json.dumps(inventory_of(container)))
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(private / "inventory.json"),
         "-e", f"@{private / 'vars.json'}", str(ROOT / playbook)],
        env={**os.environ, **ansible_env()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)


def playbook_runner(container: str, tmp_path: Path):
    """Runs a playbook of the repository against ``container`` through ansible-runner."""
    count = iter(range(1_000_000))

    def _run(playbook: str, extravars: dict[str, Any], tags: str | None = None) -> Run:
        cmdline = f"--tags {tags}" if tags else None
        private = tmp_path / f"run{next(count)}"
        private.mkdir(parents=True)
        result = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(ROOT / playbook),
            inventory=inventory_of(container),
            extravars=extravars,
            cmdline=cmdline,
            envvars=ansible_env(),
            quiet=True,
        )
        return Run(rc=result.rc, events=list(result.events))

    return _run
