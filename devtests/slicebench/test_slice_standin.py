"""The systemctl / systemd-run stand-in (a TEST DOUBLE for the GPU machine, whose PID 1 is
not systemd), driven as role bench drives systemd: its commands, and Ansible's own
systemd_service module against it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glm5_tools.slicebench import standin

REPO = Path(__file__).resolve().parents[2]
SHIMS = REPO / "tools" / "gpu" / "standin"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("GLM5_STANDIN_DIR", str(tmp_path / "units"))
    e = dict(os.environ, PATH=f"{SHIMS}:{os.environ['PATH']}", GLM5_STANDIN_PYTHON=sys.executable)
    yield e
    for spec in (tmp_path / "units").glob("*.json"):
        standin.stop(spec.stem, timeout=5)


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=60)


def test_a_registered_unit_starts_stops_and_says_so(env: dict[str, str], tmp_path: Path):
    standin.register("vllm-glm-5", SLEEPER, str(tmp_path / "server.log"), env={"PATH": "/usr/bin"})
    assert _run(["systemctl", "is-active", "vllm-glm-5.service"], env).returncode == 3
    assert _run(["systemctl", "start", "vllm-glm-5.service"], env).returncode == 0
    active = _run(["systemctl", "is-active", "vllm-glm-5.service"], env)
    assert (active.returncode, active.stdout.strip()) == (0, "active")
    assert _run(["systemctl", "is-active", "--quiet", "vllm-glm-5"], env).stdout == ""
    show = _run(["systemctl", "show", "vllm-glm-5.service"], env).stdout
    assert "LoadState=loaded" in show and "ActiveState=active" in show
    pid = standin.running_pid("vllm-glm-5")
    assert pid and os.getpgid(pid) == pid  # its own session: stop takes the whole group
    t = time.monotonic()
    assert _run(["systemctl", "stop", "vllm-glm-5.service"], env).returncode == 0
    assert time.monotonic() - t < 30
    assert _run(["systemctl", "is-active", "vllm-glm-5"], env).stdout.strip() == "inactive"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "ActiveState=inactive" in _run(["systemctl", "show", "vllm-glm-5"], env).stdout


def test_systemd_run_starts_a_transient_unit(env: dict[str, str]):
    r = _run(["systemd-run", "--unit=glm5-bench-llama-server", "--collect", "--property=Type=exec", *SLEEPER], env)
    assert r.returncode == 0 and "Running as unit: glm5-bench-llama-server.service" in r.stderr
    assert _run(["systemctl", "is-active", "glm5-bench-llama-server.service"], env).returncode == 0
    _run(["systemctl", "stop", "glm5-bench-llama-server.service"], env)
    assert "LoadState=not-found" in _run(["systemctl", "show", "glm5-bench-llama-server"], env).stdout


def test_unknown_units_and_verbs_fail(env: dict[str, str]):
    r = _run(["systemctl", "start", "nothing.service"], env)
    assert r.returncode == 5 and "not found" in r.stderr
    assert _run(["systemctl", "enable", "x"], env).returncode == 1
    assert _run(["systemd-run", *SLEEPER], env).returncode == 1


def test_ansibles_systemd_service_module_drives_it(env: dict[str, str], tmp_path: Path):
    """What role bench's llama.cpp side-by-side does: stop the unit, start it again."""
    standin.register("vllm-glm-5", SLEEPER, str(tmp_path / "server.log"), env={"PATH": "/usr/bin"})
    play = tmp_path / "play.yml"
    play.write_text("""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.systemd_service: {name: vllm-glm-5.service, state: started}
      register: first
    - ansible.builtin.systemd_service: {name: vllm-glm-5.service, state: started}
      register: again
    - ansible.builtin.assert: {that: [first is changed, again is not changed]}
    - ansible.builtin.systemd_service: {name: vllm-glm-5.service, state: stopped}
      register: stopped
    - ansible.builtin.assert: {that: [stopped is changed]}
""")
    bin_dir = Path(sys.executable).parent
    r = _run([str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-e",
              f"ansible_python_interpreter={sys.executable}", str(play)], env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert standin.running_pid("vllm-glm-5") is None
