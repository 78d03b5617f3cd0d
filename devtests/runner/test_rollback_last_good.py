"""Rollback restores only units that passed the readiness wait, and verify follows the
configured port, through ansible-runner against a systemd container running
vllm_probe_standin (the TEST DOUBLE of `vllm serve`: no GPU here).

One sequence on one container, as an operator would meet it:
  1. rollback on a host where nothing ever passed the readiness wait is refused, naming why;
  2. a good deploy G1 (port 8000): recorded as the last good unit;
  3. a run whose service never gets ready fails at the readiness wait: nothing recorded;
  4. rollback during that incident restores G1, which serves;
  5. the failing run again, then a good re-converge G2 on a non-default port (8123):
     verify passes there, and fails when pointed at another port;
  6. rollback restores G1 (the last good one before G2, never the failed unit), it
     serves on 8000 and verify passes; a rerun changes nothing.

The readiness waits print a line a round with the start-up phase the stand-in's journal
shows (vLLM's own log texts), rollback's wait too; in step 5 the failing run is a
crash loop (the stand-in stops as vLLM does when the KV cache does not fit), which must
fail the run within 30 s of the crash, naming vLLM's error.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_container import WAIT_ROUND, crash_times, playbook_runner, start_container, start_playbook
from runner_events import Run

UNIT = "/etc/systemd/system/vllm-glm-5.service"
FIXTURE = "/opt/glm5-fixture/model"
KEY = "devtest-key-not-a-secret"
SERVICE_VARS: dict[str, Any] = {
    "glm5_gpu_required": False,
    "vllm_service_command": ["/usr/bin/python3", "/opt/glm5-fixture/vllm_probe_standin.py", "serve"],
    "vllm_service_validate_args": False,
    "vllm_service_ready_timeout": 60,
    "vllm_service_api_key": KEY,
    "vllm_service_gguf_path": f"{FIXTURE}/gguf/UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00001-of-00002.gguf",
    "vllm_service_tokenizer_dir": f"{FIXTURE}/base",
    "vllm_service_hf_config_dir": f"{FIXTURE}/base",
    "vllm_service_chat_template": f"{FIXTURE}/base/chat_template.jinja",
    "rollback_health_timeout": 60,
    # A line a second in the readiness waits (their rounds are what is checked).
    "glm5_progress_interval": 1,
}
# The stand-in's start-up phases two seconds apart: several rounds of the wait.
SLOW_START: dict[str, Any] = {"vllm_service_environment": {"GLM5_STANDIN_PHASE_S": "2"}}
# The stand-in stops as vLLM does when the KV cache does not fit: a crash loop under the
# unit's Restart=on-failure (RestartSec 30 s: the run must fail before the first restart).
CRASH_LOOP: dict[str, Any] = {"vllm_service_environment": {"GLM5_STANDIN_FAIL": "kv_cache"},
                              "vllm_service_ready_timeout": 600}
# A stand-in that starts and never listens (vLLM hung while loading), with a short wait.
NEVER_READY: dict[str, Any] = {
    "vllm_service_command": ["/usr/bin/python3", "-c", "import time; time.sleep(86400)"],
    "vllm_service_ready_timeout": 10,
}


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    yield from start_container("glm5-rollback")


@pytest.fixture(scope="module")
def run(host: str, tmp_path_factory: pytest.TempPathFactory):
    return playbook_runner(host, tmp_path_factory.mktemp("rollback"))


def _read(host: str, path: str) -> str | None:
    res = subprocess.run(["docker", "exec", host, "cat", path], capture_output=True, text=True)
    return res.stdout if res.returncode == 0 else None


def _curl(host: str, port: int, path: str = "/health") -> int:
    res = subprocess.run(
        ["docker", "exec", host, "python3", "-c",
         "import sys, urllib.request as u\n"
         "try: print(u.urlopen(sys.argv[1], timeout=5).status)\n"
         "except Exception as e: print(getattr(e, 'code', 0))",
         f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True,
    )
    return int(res.stdout.strip() or 0)


def _failed_task(result: Run) -> str:
    return str(result.first_failure()["event_data"]["task"])


def _changed(result: Run) -> list[str]:
    return [e["event_data"].get("task", "?") for e in result.task_events()
            if e["event_data"].get("res", {}).get("changed")]


def _progress(result: Run) -> list[str]:
    """The readiness wait's lines: its rounds' (each round's item label; role glm5's tasks/unit_wait.yml)."""
    return [str(r["line"]) for e in result.task_events() if e["event_data"].get("task") == WAIT_ROUND
            for r in e["event_data"]["res"].get("results", []) if "line" in r]


def test_rollback_restores_the_last_unit_that_passed_the_readiness_wait(host: str, run) -> None:
    prepared = run("molecule/fixtures/model_standin_dir.yml", {})
    assert prepared.rc == 0

    # 1. Nothing passed yet: refused before any change, naming why.
    refused = run("playbooks/rollback.yml", SERVICE_VARS)
    assert refused.rc != 0
    assert _failed_task(refused) == "Require a unit that passed the readiness wait to roll back to"
    assert "no unit has passed the readiness wait" in refused.failure_message()
    assert not _changed(refused)

    # 2. A good deploy on the default port; its readiness wait says the phases reached.
    g1 = run("playbooks/service.yml", {**SERVICE_VARS, **SLOW_START})
    assert g1.rc == 0, g1.failure_message() if g1.rc else ""
    lines = _progress(g1)
    assert len(lines) >= 2, lines
    phases = ("loading the weights", "weights loaded (47.31 GiB per GPU in 312.504121 s)",
              "sizing the KV cache (31.2 GiB per GPU free for it)", "KV cache sized (1,020,928 tokens)",
              "capturing CUDA graphs", "CUDA graphs captured (in 14 s)", "engine ready (its start took 96.41 s)",
              "starting the API server on http://127.0.0.1:8000")
    assert all(re.match(r"vllm-glm-5\.service active \(running\) for \d+ s(; .+ \(at \d+ s\))?; "
                        r"http://127\.0\.0\.1:8000/health: no answer", line) for line in lines[:-1]), lines
    assert any(f"; {phase} (at " in line for phase in phases for line in lines[:-1]), lines
    assert re.match(r"vllm-glm-5\.service ready after \d+ s; application startup complete \(at \d+ s\)$",
                    lines[-1]), lines
    good_1 = _read(host, UNIT)
    assert good_1 and _read(host, f"{UNIT}.good") == good_1
    assert _read(host, f"{UNIT}.previous") is None

    # 3. A run that never gets ready fails at the readiness wait; nothing is recorded.
    bad = run("playbooks/service.yml", {**SERVICE_VARS, **NEVER_READY})
    assert bad.rc != 0 and _failed_task(bad) == WAIT_ROUND
    assert "not ready after the wait of 1" in bad.failure_message()
    bad_unit = _read(host, UNIT)
    assert bad_unit and bad_unit != good_1 and "time.sleep" in bad_unit
    assert _read(host, f"{UNIT}.good") == good_1
    assert _read(host, f"{UNIT}.previous") is None

    # 4. Rollback during the incident: back to G1, which serves; its wait reports too.
    back = run("playbooks/rollback.yml", SERVICE_VARS)
    assert back.rc == 0, back.failure_message() if back.rc else ""
    assert _progress(back) and _progress(back)[-1].startswith("vllm-glm-5.service ready after "), _progress(back)
    assert _read(host, UNIT) == good_1
    assert _curl(host, 8000) == 200

    # 5. Fail again, as a crash loop: the run fails within 30 s of the crash (before
    #    systemd's first restart), naming vLLM's error; then re-converge with good
    #    settings on a non-default port.
    crash = run("playbooks/service.yml", {**SERVICE_VARS, **CRASH_LOOP})
    assert crash.rc != 0 and _failed_task(crash) == WAIT_ROUND
    crash_to_failure = crash.failed_at() - crash_times(host, "vllm-glm-5.service")[-1]
    message = crash.failure_message()
    assert message.startswith("vllm-glm-5.service is restarting after a crash (exit-code)"), message
    assert "ValueError: To serve at least one request with the models's max seq len" in message
    assert "EngineCore failed to start." in message
    assert 0 <= crash_to_failure < 30, f"the run failed {crash_to_failure:.1f} s after the crash"
    print(f"crash loop: the run failed {crash_to_failure:.1f} s after the unit's crash")  # shown with -s
    port_vars = {**SERVICE_VARS, "glm5_api_port": 8123}
    g2 = run("playbooks/service.yml", port_vars)
    assert g2.rc == 0, g2.failure_message() if g2.rc else ""
    good_2 = _read(host, UNIT)
    assert good_2 and "\"--port\" \"8123\"" in good_2  # ExecStart words are quoted (glm5_systemd_exec_args)
    assert _read(host, f"{UNIT}.good") == good_2
    assert _read(host, f"{UNIT}.previous") == good_1, "the previous good unit must be G1, not the failed one"
    verified = run("playbooks/verify.yml", port_vars)
    assert verified.rc == 0, verified.failure_message() if verified.rc else ""
    assert any("8123" in str(e["event_data"].get("res", {}).get("url", "")) for e in verified.task_events())
    # The check can fail: verify pointed at a port nothing serves on.
    wrong = run("playbooks/verify.yml", {**SERVICE_VARS, "glm5_api_port": 8124, "vllm_service_ready_timeout": 5})
    assert wrong.rc != 0 and _failed_task(wrong) == "Wait for vLLM's /health"

    # 6. Rollback: the last good unit before G2 (G1), never the failed one; it serves.
    rolled = run("playbooks/rollback.yml", SERVICE_VARS)
    assert rolled.rc == 0, rolled.failure_message() if rolled.rc else ""
    assert _read(host, UNIT) == good_1
    assert _read(host, f"{UNIT}.good") == good_1
    assert _read(host, f"{UNIT}.previous") == good_2
    assert _curl(host, 8000) == 200 and _curl(host, 8000, "/v1/models") == 401
    assert run("playbooks/verify.yml", SERVICE_VARS).rc == 0
    again = run("playbooks/rollback.yml", SERVICE_VARS)
    assert again.rc == 0 and not _changed(again)


def _active(host: str, unit: str) -> str:
    return subprocess.run(["docker", "exec", host, "systemctl", "is-active", unit],
                          capture_output=True, text=True).stdout.strip()


def test_renaming_the_served_model_replaces_the_unit(host: str, run) -> None:
    """A new served name (glm5_served_model_name: glm-5b, unit vllm-glm-5b.service) on the
    host the sequence above left serving as vllm-glm-5.service on port 8000: the
    validation phase accepts the port the role's own old unit holds; the old unit is
    stopped, disabled and removed with its records before the new one starts on the same
    port; a second run changes nothing."""
    assert _active(host, "vllm-glm-5.service") == "active"
    renamed = {**SERVICE_VARS, "glm5_served_model_name": "glm-5b"}
    first = run("playbooks/service.yml", renamed)
    assert first.rc == 0, first.failure_message() if first.rc else ""
    for old in (UNIT, f"{UNIT}.good", f"{UNIT}.previous", "/etc/glm5/vllm-glm-5.env", "/etc/glm5/vllm-glm-5.cmdline",
                "/etc/glm5/vllm-glm-5.rollback.yml"):
        assert _read(host, old) is None, old
    assert _active(host, "vllm-glm-5.service") != "active"
    new_unit = _read(host, "/etc/systemd/system/vllm-glm-5b.service")
    assert new_unit and "glm-5b" in new_unit
    assert _active(host, "vllm-glm-5b.service") == "active"
    assert _curl(host, 8000) == 200 and _curl(host, 8000, "/v1/models") == 401
    again = run("playbooks/service.yml", renamed)
    assert again.rc == 0 and not _changed(again), _changed(again)


def _main_pid(host: str, unit: str) -> int:
    return int(subprocess.run(["docker", "exec", host, "systemctl", "show", "--value", "--property=MainPID", unit],
                              capture_output=True, text=True).stdout.strip() or 0)


def _environ(host: str, pid: int) -> str:
    return subprocess.run(["docker", "exec", host, "cat", f"/proc/{pid}/environ"],
                          capture_output=True, text=True).stdout.replace("\0", "\n")


def test_service_run_killed_after_the_new_unit_then_rerun_serves(host: str, run, tmp_path: Path) -> None:
    """A service run SIGKILLed (the whole ansible-playbook process group) once it has
    written a new unit, before its handlers reloaded systemd and restarted the service:
    the service still runs the old unit and nothing is recorded. The rerun finds the
    files as asked (nothing to notify), sees that systemd or the service is behind them,
    reloads and restarts; the service then runs the new unit, serves, and only then is
    the new unit recorded as the last good one; a third run changes nothing. The host
    is left by the test above serving glm-5b (vllm-glm-5b.service) on port 8000."""
    service = "vllm-glm-5b.service"
    unit = f"/etc/systemd/system/{service}"
    before = _read(host, unit)
    assert before and _read(host, f"{unit}.good") == before
    pid_before = _main_pid(host, service)
    assert pid_before > 0
    # a changed environment in the unit (the stand-in's phases 2 s apart): a restart due
    changed = {**SERVICE_VARS, "glm5_served_model_name": "glm-5b", **SLOW_START}
    killed = start_playbook(host, tmp_path / "killed", "playbooks/service.yml", changed)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and killed.poll() is None:
            if "GLM5_STANDIN_PHASE_S" in (_read(host, unit) or ""):
                break
            time.sleep(0.1)
        assert killed.poll() is None, f"the run ended (rc {killed.returncode}) before it wrote the new unit"
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert "GLM5_STANDIN_PHASE_S" in (_read(host, unit) or ""), "the run never wrote the new unit"
    assert _main_pid(host, service) == pid_before, "killed too late: the service was restarted already"
    assert "GLM5_STANDIN_PHASE_S" not in _environ(host, pid_before)
    assert _read(host, f"{unit}.good") == before, "a unit that never passed the readiness wait was recorded"

    rerun = run("playbooks/service.yml", changed)
    assert rerun.rc == 0, rerun.failure_message() if rerun.rc else ""
    assert "Finish the reload and restart that a killed run left undone" in _changed(rerun), _changed(rerun)
    pid_after = _main_pid(host, service)
    assert pid_after not in (0, pid_before)
    assert "GLM5_STANDIN_PHASE_S=2" in _environ(host, pid_after)
    assert _curl(host, 8000) == 200 and _curl(host, 8000, "/v1/models") == 401
    after = _read(host, unit)
    assert after and after != before and _read(host, f"{unit}.good") == after
    again = run("playbooks/service.yml", changed)
    assert again.rc == 0 and not _changed(again), _changed(again)
