"""Issue 19 item 6, the no-op shortcut on a real systemd host (the molecule test image):
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


def host_state(box: str, state: str, check: bool = False) -> dict[str, Any]:
    args = {
        "state": state,
        "inputs": {"settings": "s"},
        "record": RECORD,
        "roots": ["/etc", {"path": "/var/lib/dpkg/status", "depth": 0}],
        "commands": [["cat", "/etc/glm5-live"]],
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


def test_drift_between_runs_is_seen_and_named(box):
    sh(box, f"printf '[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart=/bin/true\\n"
            f"[Install]\\nWantedBy=multi-user.target\\n' > /etc/systemd/system/{UNIT} && "
            f"systemctl daemon-reload && systemctl enable --now {UNIT} && echo 1 > /etc/glm5-live")
    recorded = host_state(box, "record")
    assert recorded["changed"] is False and recorded["entries"] > 100
    assert sh(box, f"stat -c %a {RECORD}").strip() == "600"
    assert host_state(box, "probe")["unchanged"] is True

    sh(box, f"systemctl stop {UNIT}")
    assert host_state(box, "probe")["differ"] == ["units"]
    sh(box, f"systemctl start {UNIT}")
    assert host_state(box, "probe")["unchanged"] is True  # back as it was: a match again

    sh(box, f"systemctl disable {UNIT}")
    assert "units" in host_state(box, "probe")["differ"]
    sh(box, f"systemctl enable {UNIT}")

    sh(box, "echo 2 > /tmp/x && cp --preserve=timestamps /tmp/x /etc/glm5-live")  # a live setting changed
    differ = host_state(box, "probe")["differ"]
    assert "command:cat /etc/glm5-live" in differ and "files:/etc" in differ

    host_state(box, "record", check=True)  # check mode: the old record stays
    assert host_state(box, "probe")["unchanged"] is False
    host_state(box, "record")
    assert host_state(box, "probe")["unchanged"] is True

    package = sh(box, "dpkg-query -W -f '${Package}\\n' | head -1").strip()
    sh(box, f"apt-mark hold {package} >/dev/null")
    assert host_state(box, "probe")["differ"] == ["files:/var/lib/dpkg/status"]
