"""Post-deploy checks after playbooks/rollback.yml (role rollback), and of rolling restarts.

The rollback checks skip on a host where no rollback is in effect (no record, or a
deploy since); the venv checks also where the rollback restored the unit only. The
restart check reads the unit's journal on every host of the group and fails when two
hosts were out of service at the same time.

Environment: GLM5_ML_ENV_PATH (/opt/ml-env), GLM5_ML_ENV_ROOT (/opt/ml-envs),
GLM5_UV_VENV (/opt/glm5-uv), GLM5_SERVED_MODEL_NAME (glm-5), GLM5_ROLLOUT_GROUP
(gpu_servers), GLM5_ROLLBACK_RECORD (/etc/glm5/vllm-<name>.rollback.yml),
GLM5_READY_REGEX (what the service logs once it serves; vLLM's and
vllm_probe_standin's lines by default). Set by molecule scenario upgrade, optional
elsewhere: GLM5_ROLLBACK_EXPECTED_LOCK (a lock file on the controller: the venv rolled
back to must be the one built from it) and GLM5_EXPECTED_RESTARTS (how many times each
host's service was restarted).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import testinfra
import yaml

ML_ENV = os.environ.get("GLM5_ML_ENV_PATH", "/opt/ml-env")
ML_ENV_ROOT = os.environ.get("GLM5_ML_ENV_ROOT", "/opt/ml-envs")
UV_VENV = os.environ.get("GLM5_UV_VENV", "/opt/glm5-uv")
NAME = os.environ.get("GLM5_SERVED_MODEL_NAME", "glm-5")
UNIT = f"vllm-{NAME}.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
RECORD = os.environ.get("GLM5_ROLLBACK_RECORD", f"/etc/glm5/vllm-{NAME}.rollback.yml")
PREVIOUS = f"{ML_ENV_ROOT}/.glm5-previous"
GROUP = os.environ.get("GLM5_ROLLOUT_GROUP", "gpu_servers")
READY = re.compile(os.environ.get("GLM5_READY_REGEX", r"Application startup complete|vllm_probe_standin: serving"))
EXPECTED_LOCK = os.environ.get("GLM5_ROLLBACK_EXPECTED_LOCK", "")
EXPECTED_RESTARTS = os.environ.get("GLM5_EXPECTED_RESTARTS", "")
# systemd's catalogue id of "Stopping <unit>" (SD_MESSAGE_UNIT_STOPPING).
STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.M)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _unit_venv(text: str) -> str:
    match = re.search(r'^Environment="?GLM5_ML_ENV=([^"\n]*)"?\s*$', text, re.M)
    return match.group(1) if match else ""


def _rollback(host: Any) -> dict[str, str]:
    """The record of the rollback in effect on this host, or skip."""
    record = host.file(RECORD)
    if not record.exists:
        pytest.skip("no rollback was run on this host")
    data = yaml.safe_load(record.content_string)
    assert isinstance(data, dict) and {"from", "to", "unit_from", "unit_to", "good"} <= set(data), (
        f"{RECORD}: {record.content_string!r}")
    unit = host.file(UNIT_FILE)
    if data["to"] and host.file(ML_ENV).linked_to != data["to"]:
        pytest.skip("the venv was upgraded after the last rollback")
    if not unit.exists or hashlib.sha256(unit.content).hexdigest() != data["unit_to"]:
        pytest.skip("the unit was deployed again after the last rollback")
    return {key: str(data[key]) for key in ("from", "to", "unit_from", "unit_to", "good")}


def _venv_rollback(host: Any) -> dict[str, str]:
    done = _rollback(host)
    if done["from"] == done["to"]:
        pytest.skip("the last rollback restored the unit only (same venv)")
    return done


def test_rollback_link_on_restored_complete_venv(host):
    done = _venv_rollback(host)
    link = host.file(ML_ENV)
    assert link.is_symlink
    assert link.linked_to == done["to"] != done["from"]
    assert re.fullmatch(re.escape(ML_ENV_ROOT) + r"/ml-env-[0-9a-f]{12}", done["to"]), done
    lock = host.file(f"{done['to']}/glm5-lock.txt").content
    assert host.file(f"{done['to']}/.glm5-lock.sha256").content_string.strip() == hashlib.sha256(lock).hexdigest()
    # The venv left is kept and recorded, so a forced second rollback can roll forward.
    assert host.file(f"{done['from']}/.glm5-lock.sha256").exists
    assert host.file(PREVIOUS).content_string.strip() == done["from"]


def test_rollback_venv_matches_its_lock(host):
    done = _venv_rollback(host)
    cmd = host.run(f"{ML_ENV}/bin/python {UV_VENV}/ml_env_verify.py {done['to']}/glm5-lock.txt")
    assert cmd.stdout, cmd.stderr
    report = json.loads(cmd.stdout.strip().splitlines()[-1])
    assert report["mismatches"] == {}, report


def test_rollback_units_belong_to_their_venvs(host):
    done = _rollback(host)
    unit = host.file(UNIT_FILE)
    # The restored unit is the last good one (it passed role vllm_service's readiness wait).
    good = host.file(f"{UNIT_FILE}.good")
    assert good.exists and good.content == unit.content, f"{UNIT_FILE}: not the last good unit"
    assert hashlib.sha256(good.content).hexdigest() == done["good"]
    assert _unit_venv(unit.content_string) in ("", done["to"])
    previous = host.file(f"{UNIT_FILE}.previous")
    if previous.exists and hashlib.sha256(previous.content).hexdigest() == done["unit_from"]:
        # Rolled back from a good unit: it is kept, for a forced second rollback to roll forward.
        assert unit.content_string != previous.content_string
        assert _unit_venv(previous.content_string) in ("", done["from"])


def test_rollback_service_runs_on_restored_venv(host):
    done = _rollback(host)
    if not host.file(UNIT_FILE).exists:
        pytest.skip(f"{UNIT} is not installed on this host")
    service = host.service(UNIT)
    assert service.is_running
    if not _unit_venv(host.file(UNIT_FILE).content_string):
        pytest.skip("the unit does not name its venv (rendered before GLM5_ML_ENV existed)")
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    environ = host.file(f"/proc/{pid}/environ").content.split(b"\0")
    assert f"GLM5_ML_ENV={done['to']}".encode() in environ, "the service was not restarted after the rollback"


def test_rollback_expected_lock_restored(host):
    """The venv rolled back to is the one built from GLM5_ROLLBACK_EXPECTED_LOCK, and its
    pinned versions are what imports from it."""
    if not EXPECTED_LOCK:
        pytest.skip("GLM5_ROLLBACK_EXPECTED_LOCK not set")
    done = _venv_rollback(host)
    lock = Path(EXPECTED_LOCK).read_bytes()
    assert done["to"] == f"{ML_ENV_ROOT}/ml-env-{hashlib.sha256(lock).hexdigest()[:12]}"
    assert host.file(f"{ML_ENV}/glm5-lock.txt").content == lock
    pins = {_norm(name): version for name, version in PIN.findall(lock.decode())}
    probe = (
        "import importlib, importlib.metadata as md, json, re, sys\n"
        "norm = lambda n: re.sub(r'[-_.]+', '-', n).lower()\n"
        "pins = json.loads(sys.argv[1])\n"
        "versions = {norm(d.metadata['Name']): d.version for d in md.distributions()}\n"
        "mods = sorted(m for m, ds in md.packages_distributions().items()\n"
        "              if m.isidentifier() and any(norm(d) in pins for d in ds))\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "print(json.dumps({'versions': {n: versions.get(n) for n in pins}, 'files': files}))\n"
    )
    cmd = host.run(f"{ML_ENV}/bin/python -c {_shq(probe)} {_shq(json.dumps(pins))}")
    assert cmd.rc == 0, cmd.stderr
    report = json.loads(cmd.stdout)
    assert report["versions"] == pins
    assert report["files"], "no module of the pinned packages found"
    for module, path in report["files"].items():
        assert path.startswith(f"{ML_ENV}/"), (module, path)


def _out_of_service(host: Any) -> list[tuple[int, int]]:
    """(stop, ready) windows of the unit's restarts, in microseconds of the realtime clock
    (the same clock for every host of a test run: the containers share one kernel)."""
    cmd = host.run(f"journalctl --no-pager -o json -u {UNIT}")
    assert cmd.rc == 0, cmd.stderr
    windows: list[tuple[int, int]] = []
    stop: int | None = None
    for line in cmd.stdout.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        text = message if isinstance(message, str) else bytes(message or []).decode(errors="replace")
        when = int(entry["__REALTIME_TIMESTAMP"])
        if entry.get("MESSAGE_ID") == STOPPING and stop is None:
            stop = when
        elif stop is not None and entry.get("_SYSTEMD_UNIT") == UNIT and READY.search(text):
            windows.append((stop, when))
            stop = None
    if stop is not None:  # stopped and never ready again: out of service until now
        windows.append((stop, 2**63))
    return windows


def _peers(host: Any) -> list[Any]:
    backend = host.backend
    if backend.get_connection_type() != "ansible":
        pytest.skip("needs testinfra's ansible backend (--hosts=ansible://...) to reach the other hosts")
    variables = host.ansible.get_variables()
    names = [n for n in variables.get("groups", {}).get(GROUP, []) if n != variables["inventory_hostname"]]
    if not names:
        pytest.skip(f"one host in {GROUP}: nothing to roll across")
    return [testinfra.get_host(f"ansible://{name}", ansible_inventory=backend.ansible_inventory) for name in names]


def test_rollback_and_upgrade_restart_one_host_at_a_time(host):
    if not host.file(UNIT_FILE).exists:
        pytest.skip(f"{UNIT} is not installed on this host")
    peers = _peers(host)
    mine = _out_of_service(host)
    if EXPECTED_RESTARTS:
        assert len(mine) == int(EXPECTED_RESTARTS), mine
    for peer in peers:
        for start, end in mine:
            for p_start, p_end in _out_of_service(peer):
                assert end < p_start or p_end < start, (
                    f"out of service at the same time: this host {start}..{end}, "
                    f"{peer.backend.get_hostname()} {p_start}..{p_end} (µs)"
                )


def _shq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
