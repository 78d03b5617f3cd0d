"""Faults during a run, through ansible-runner against a systemd test container (real
apt, dpkg, uv and PyPI through the development host's CA and uv cache), one sequence on
one container as an operator would meet it:

1. another process holds dpkg's lock past glm5_apt_lock_timeout (3 s here): role glm5's
   apt install is refused after the bound, in one line naming the lock file and the
   holder's pid and command; nothing installed;
2. the lock is released within the bound: the install waits for it and goes on
   (playbooks/python_env.yml with a small lock: role ml_env's Python install);
3. the run is killed with SIGKILL while uv installs the venv of a new lock (numpy, a
   wheel of ~1,000 files, stopped half-way): the install, an async job on the host,
   outlives the run; the link stays on the previous venv. The rerun waits for that
   leftover install through the venv's build lock before it removes the partial venv,
   then builds it again: every file of every installed distribution has its RECORD
   sha256, the link moves to it, no uv is left running.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from runner_container import ROOT, ansible_env, inventory_of, start_container, start_playbook
from runner_events import Run

HERE = Path(__file__).resolve().parent
CA = os.environ.get("GLM5_TEST_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
UV_CACHE = os.environ.get("GLM5_TEST_UV_CACHE", "/var/cache/glm5-test/uv")
LOCK_A = ROOT / "molecule/upgrade/locks/lock-a.txt"
LOCK_C = HERE / "locks/numpy.txt"
HOLDER = "/root/hold_dpkg_lock.py"
ENV_VARS: dict[str, Any] = {
    "glm5_ca_bundle": "/opt/glm5-test/ca.crt",
    "ml_env_uv_cache_dir": "/var/cache/glm5-test/uv",
    "ml_env_min_gpus": 0,
    "glm5_gpu_required": False,
    "flash_attn_enabled": False,
    "ml_env_lock_file": str(LOCK_A),
    "ml_env_required_pins": {"six": "", "idna": ""},
    "ml_env_verify_modules": ["six", "idna"],
}
LOCK_C_VARS: dict[str, Any] = {
    "ml_env_lock_file": str(LOCK_C),
    "ml_env_required_pins": {"numpy": ""},
    "ml_env_verify_modules": ["numpy"],
}
APT_PLAY = """---
- name: One guarded apt install (role glm5's tasks/apt.yml)
  hosts: gpu_servers
  gather_facts: false
  become: true
  tasks:
    - name: Install the venv's Python
      ansible.builtin.include_role:
        name: glm5
        tasks_from: apt
      vars:
        glm5_apt_what: the venv's Python
        glm5_apt_packages: [python3.13-venv]
        glm5_apt_update_cache: true
"""


def venv_of(lock: Path) -> str:
    return f"/opt/ml-envs/ml-env-{hashlib.sha256(lock.read_bytes()).hexdigest()[:12]}"


@pytest.fixture(scope="module")
def box() -> Iterator[str]:
    Path(UV_CACHE).mkdir(parents=True, exist_ok=True)
    volumes = [f"{CA}:/opt/glm5-test/ca.crt:ro", f"{UV_CACHE}:/var/cache/glm5-test/uv:rw"]
    yield from start_container("glm5-faults", volumes)


def sh(box: str, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", "exec", box, "sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 or not check, done.stderr
    return done


def run(box: str, tmp: Path, playbook: Path, extravars: dict[str, Any], on_task: Any = None) -> Run:
    """A playbook through ansible-runner; on_task(name) is called as each task starts."""
    private = Path(tmp) / f"run-{time.monotonic_ns()}"
    private.mkdir(parents=True)

    def handler(event: dict[str, Any]) -> bool:
        if on_task is not None and event.get("event") == "playbook_on_task_start":
            on_task(str(event["event_data"].get("task", "")))
        return True

    result = ansible_runner.run(private_data_dir=str(private), playbook=str(playbook), inventory=inventory_of(box),
                                extravars=extravars, envvars=ansible_env(), quiet=True, event_handler=handler)
    return Run(rc=result.rc, events=list(result.events))


def task_result(result: Run, name: str) -> dict[str, Any]:
    for event in result.task_events():
        if event["event_data"].get("task") == name:
            return dict(event["event_data"]["res"])
    raise AssertionError(f"no task {name!r} ran")


def hold_dpkg_lock(box: str, seconds: int) -> int:
    sh(box, "rm -f /root/dpkg-lock-holder; mkdir -p /var/lib/dpkg && touch /var/lib/dpkg/lock-frontend")
    subprocess.run(["docker", "exec", "-d", box, "python3", HOLDER, str(seconds)], check=True)
    for _ in range(100):
        got = sh(box, "cat /root/dpkg-lock-holder 2>/dev/null", check=False).stdout.strip()
        if got:
            return int(got)
        time.sleep(0.1)
    raise AssertionError("the lock holder did not start")


@pytest.fixture(scope="module")
def helpers(box: str) -> None:
    for name in ("hold_dpkg_lock.py", "release_when_waited.py", "stop_uv.py", "resume_uv.py", "record_check.py"):
        subprocess.run(["docker", "cp", str(HERE / "faults" / name), f"{box}:/root/{name}"], check=True)


def test_dpkg_lock_held_past_the_bound_is_refused_naming_the_holder(box: str, helpers: None, tmp_path: Path) -> None:
    pid = hold_dpkg_lock(box, 600)
    try:
        # The holder is a lock as apt sees it: apt itself cannot take it.
        blocked = sh(box, "apt-get install -y python3.13-venv", check=False)
        assert blocked.returncode != 0 and "Could not get lock /var/lib/dpkg/lock-frontend" in blocked.stderr
        play = tmp_path / "apt.yml"
        play.write_text(APT_PLAY)
        start = time.monotonic()
        result = run(box, tmp_path, play, {"glm5_apt_lock_timeout": 3})
        took = time.monotonic() - start
        assert result.rc != 0
        failure = result.first_failure()
        assert failure["event_data"]["task"] == "Wait for dpkg's lock before installing the venv's Python"
        msg = failure["event_data"]["res"]["msg"]
        assert "\n" not in msg.strip(), msg
        assert msg.startswith(f"/var/lib/dpkg/lock-frontend is still held by pid {pid} (python3 {HOLDER} 600)"), msg
        assert "glm5_apt_lock_timeout = 3" in msg and "nothing was installed" in msg
        assert 3 <= failure["event_data"]["res"]["waited"] < 6, failure["event_data"]["res"]
        assert sh(box, "dpkg -s python3.13-venv", check=False).returncode != 0
        print(f"refused after {failure['event_data']['res']['waited']} s of waiting, the run {took:.1f} s")
    finally:
        sh(box, f"kill {pid}", check=False)


def test_dpkg_lock_released_within_the_bound_is_waited_for(box: str, helpers: None, tmp_path: Path) -> None:
    pid = hold_dpkg_lock(box, 600)
    released: list[float] = []

    def release_later(task: str) -> None:
        # Once the wait's module runs, it waits 3 s more, then the holder ends.
        if task.startswith("Wait for dpkg's lock") and not released:
            released.append(time.monotonic())
            subprocess.run(["docker", "exec", "-d", box, "python3", "/root/release_when_waited.py", str(pid), "3"],
                           check=True)

    try:
        result = run(box, tmp_path, ROOT / "playbooks/python_env.yml", {**ENV_VARS, "glm5_apt_lock_timeout": 60},
                     on_task=release_later)
        assert result.rc == 0, result.first_failure()["event_data"]["res"].get("msg")
        waited = task_result(result, "Wait for dpkg's lock before installing the venv's Python")
        assert released and 1 <= waited["waited"] < 60 and waited["held"]["pid"] == pid, waited
        assert sh(box, "cat /root/released").stdout == "released\n"
        assert sh(box, "dpkg -s python3.13-venv", check=False).returncode == 0
        assert sh(box, "readlink /opt/ml-env").stdout.strip() == venv_of(LOCK_A)
        print(f"waited {waited['waited']} s for the lock, then installed")
    finally:
        sh(box, f"kill {pid}", check=False)


def test_sigkill_during_the_venv_install_then_rerun(box: str, helpers: None, tmp_path: Path) -> None:
    venv_a, venv_c = venv_of(LOCK_A), venv_of(LOCK_C)
    site_c = f"{venv_c}/lib/python3.13/site-packages"
    assert sh(box, "readlink /opt/ml-env").stdout.strip() == venv_a, "needs the converged venv of lock A"
    sh(box, "rm -f /root/stopped.json /root/resumed.json")
    subprocess.run(["docker", "exec", "-d", box, "python3", "/root/stop_uv.py", site_c, "numpy", venv_c,
                    "/root/stopped.json"], check=True)
    killed = start_playbook(box, tmp_path / "killed", "playbooks/python_env.yml", {**ENV_VARS, **LOCK_C_VARS})
    try:
        deadline = time.monotonic() + 600
        stopped: dict[str, Any] = {}
        while time.monotonic() < deadline and killed.poll() is None:
            got = sh(box, "cat /root/stopped.json 2>/dev/null", check=False).stdout
            if got:
                stopped = json.loads(got)
                break
            time.sleep(0.3)
        assert stopped, f"uv never began to install numpy (run ended: {killed.poll()})"
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert stopped["pids"], stopped
    # Killed half-way: the venv has no completion marker, the link stays on lock A's venv,
    # the install (stopped here, so that the rerun meets it) is still on the host.
    assert sh(box, f"test -e {venv_c}/.glm5-lock.sha256", check=False).returncode != 0
    assert sh(box, "readlink /opt/ml-env").stdout.strip() == venv_a
    assert sh(box, f"kill -0 {stopped['pids'][0]}", check=False).returncode == 0

    subprocess.run(["docker", "exec", "-d", box, "python3", "/root/resume_uv.py", venv_c, "3", "/root/resumed.json",
                    ",".join(map(str, stopped["pids"]))], check=True)
    start = time.monotonic()
    rerun = run(box, tmp_path, ROOT / "playbooks/python_env.yml", {**ENV_VARS, **LOCK_C_VARS})
    took = time.monotonic() - start
    assert rerun.rc == 0, rerun.first_failure()["event_data"]["res"].get("msg")
    resumed = json.loads(sh(box, "cat /root/resumed.json").stdout)
    assert resumed == {"remover_waited": True, "uv_alive": stopped["pids"]}, resumed
    assert sh(box, f"cat {venv_c}/.glm5-lock.sha256").stdout.strip() == hashlib.sha256(LOCK_C.read_bytes()).hexdigest()
    assert sh(box, "readlink /opt/ml-env").stdout.strip() == venv_c
    checked = sh(box, f"{venv_c}/bin/python /root/record_check.py").stdout.strip()
    numpy_files = int(sh(box, f"find {site_c}/numpy -type f | wc -l").stdout)
    assert stopped["files"] < numpy_files, (stopped, numpy_files)
    assert sh(box, f"pgrep -f '[p]ip sync.*{venv_c}'", check=False).returncode == 1
    print(f"killed with {stopped['files']} of {numpy_files} numpy files in place; rerun {took:.1f} s; {checked}")
