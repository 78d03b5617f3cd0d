"""The no-op shortcut on a real systemd host (the molecule test image):
module glm5_host_state, run by Ansible, records the state and then sees each drift an
operator or another tool can cause between two runs (a unit stopped or disabled, a
package held, a file under /etc changed with its times put back), says which part
differs, and matches again once the state is back. In check mode it writes no record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_container import start_container

ROOT = Path(__file__).resolve().parents[2]
UNIT = "glm5-probe-test.service"
RECORD = "/var/lib/glm5-run/test-record.json"


@pytest.fixture(scope="module")
def box() -> Iterator[str]:
    yield from start_container("glm5-hoststate")


def sh(box: str, script: str) -> str:
    done = subprocess.run(["docker", "exec", box, "sh", "-c", script], capture_output=True, text=True, check=True)
    return done.stdout


def host_state(box: str, state: str, check: bool = False, take: bool = True) -> dict[str, Any]:
    args = {
        "state": state,
        "inputs": {"settings": "s"},
        "record": RECORD,
        "roots": ["/etc", {"path": "/var/lib/dpkg/status", "depth": 0}],
        "commands": [["cat", "/etc/glm5-live"]],
        "take": take,
    }
    env = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(ROOT / "roles/glm5/library"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_PIPELINING": "true",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    cmd = ["ansible", "all", "-i", f"{box},", "-c", "community.docker.docker",
           "-e", "ansible_python_interpreter=/usr/bin/python3", "-m", "glm5_host_state", "-a", json.dumps(args)]
    done = subprocess.run(cmd + (["--check"] if check else []), capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"][box]


def drift(box: str, change: str, restore: str) -> list[str]:
    """What the probe names after change; restore, record again, and a match again."""
    assert host_state(box, "probe")["unchanged"] is True
    sh(box, change)
    differ = host_state(box, "probe")["differ"]
    sh(box, restore)
    assert host_state(box, "probe")["differ"] == ["no record of an earlier full run"]  # the mismatch removed it
    host_state(box, "record")
    return differ


def test_drift_between_runs_is_seen_and_named(box):
    sh(box, f"printf '[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart=/bin/true\\n"
            f"[Install]\\nWantedBy=multi-user.target\\n' > /etc/systemd/system/{UNIT} && "
            f"systemctl daemon-reload && systemctl enable --now {UNIT} && echo 1 > /etc/glm5-live")
    recorded = host_state(box, "record")
    assert recorded["changed"] is False and recorded["entries"] > 100
    assert sh(box, f"stat -c %a {RECORD}").strip() == "600"

    assert drift(box, f"systemctl stop {UNIT}", f"systemctl start {UNIT}") == ["units"]
    assert "units" in drift(box, f"systemctl disable {UNIT}", f"systemctl enable {UNIT}")
    # A live setting changed, and a file rewritten with its old times put back.
    differ = drift(box, "echo 2 > /tmp/x && cp --preserve=timestamps /tmp/x /etc/glm5-live", "true")
    assert "command:cat /etc/glm5-live" in differ and "files:/etc" in differ
    package = sh(box, "dpkg-query -W -f '${Package}\\n' | head -1").strip()
    assert drift(box, f"apt-mark hold {package} >/dev/null", "true") == ["files:/var/lib/dpkg/status"]


def test_check_mode_neither_writes_nor_removes_a_record(box):
    host_state(box, "record")
    sh(box, "echo 3 > /etc/glm5-live")
    assert host_state(box, "probe", check=True)["unchanged"] is False
    host_state(box, "record", check=True)
    assert host_state(box, "probe", check=True)["differ"] == ["command:cat /etc/glm5-live", "files:/etc"]


def test_a_run_that_may_not_take_the_shortcut_removes_the_record(box):
    host_state(box, "record")
    assert host_state(box, "probe", take=False)["differ"] == ["the shortcut is not taken in this run"]
    assert host_state(box, "probe")["differ"] == ["no record of an earlier full run"]


MINI_SITE = """---
- name: Probe
  ansible.builtin.import_playbook: {root}/playbooks/unchanged.yml
- name: A phase that repaired something on the host (as role vllm_patches does)
  hosts: gpu_servers
  gather_facts: false
  tasks:
    - name: Note a repair
      ansible.builtin.set_fact:
        glm5_integrity_repairs: ["vLLM file vllm/envs.py"]
      when: repaired | bool
- name: Record
  ansible.builtin.import_playbook: {root}/playbooks/record.yml
"""


def site_run(box: str, tmp: Path, repaired: bool) -> str:
    play = tmp / "mini_site.yml"
    play.write_text(MINI_SITE.format(root=ROOT))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_PIPELINING": "true",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    inventory = tmp / "inventory.yml"
    inventory.write_text(f"all:\n  children:\n    gpu_servers:\n      hosts:\n        {box}:\n"
                         "          ansible_connection: community.docker.docker\n"
                         "          ansible_python_interpreter: /usr/bin/python3\n")
    done = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(play), "-e", f"repaired={str(repaired).lower()}",
         "-e", "glm5_noop_shortcut=true", "-e", f"glm5_host_state_record={RECORD}", "-e", "glm5_gpu_required=false"],
        capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    return " ".join(done.stdout.split())  # the callback wraps long messages


def test_no_record_after_a_run_that_repaired(box, tmp_path):
    """playbooks/record.yml writes no record on a host where the run repaired something
    (glm5_integrity_repairs), and says so; the run had removed the old one, so the next
    run is a full one; a full run without a repair records again."""
    host_state(box, "record")
    out = site_run(box, tmp_path, repaired=True)
    assert "No record: this run repaired vLLM file vllm/envs.py; the next run verifies this host in full again." in out
    assert sh(box, f"test -e {RECORD} && echo present || echo absent").strip() == "absent"
    out = site_run(box, tmp_path, repaired=False)
    assert "No record:" not in out and "Full run: [''no record of an earlier full run'']" in out
    assert sh(box, f"test -e {RECORD} && echo present || echo absent").strip() == "present"
