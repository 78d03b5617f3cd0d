"""The validation phase (playbooks/validate.yml) refuses bad input before anything
changes: site.yml with one bad -e value at a time, through ansible-runner, against a
systemd container prepared as a later run finds the host (playbooks/validation_host.yml:
NVIDIA's repository configured from fake_nvidia_repo, the TEST DOUBLE of NVIDIA's
repository; a running vllm-glm-5.service, a TEST DOUBLE of vLLM on port 8000; another
program on port 2222).

Each row: refused (rc != 0); the first failed task is the validation phase's last one,
in its play; no task reported a change before it; the message names the variable and
the value, one line per bad value; a snapshot of /etc /opt /usr/local /srv /var/lib is
the same before and after; the refusal comes within ELAPSED_BOUND_S of the playbook's
start (runner event timestamps).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
VALIDATE_PLAY = "Validate — every setting of the run, before anything changes"
REFUSE_TASK = "Refuse the run (one line per bad value; nothing was changed)"
# From the playbook's start to the refusal (runner event timestamps). What makes the
# refusal early is structural and asserted exactly: it is the validation play's last
# task and no other play started. The time bound is a guard against a regression to
# the old behaviour (refusals 78-91 s in, after three phases ran, on a quiet host) and
# leaves room for the loaded 2-core CI machine (JOBS runs at once beside the molecule
# stage): measured there, 30-100 s; on a quiet host a few seconds (docs/architecture.md).
ELAPSED_BOUND_S = float(os.environ.get("GLM5_VALIDATE_BOUND_S", "150"))
# Table rows run at a time (each is an ansible-playbook process).
JOBS = int(os.environ.get("GLM5_VALIDATE_JOBS", "3"))
SNAPSHOT_DIRS = "/etc /opt /usr/local /srv /var/lib"
# systemd's and apt's own bookkeeping changes without any run.
SNAPSHOT_PRUNE = ("/var/lib/systemd", "/var/lib/apt/periodic", "/var/lib/dhcp")
SECRET_MARK = "sekrit-6d1f"

# (id, overrides, texts every one of which the refusal must contain: the variable and
# the value). Every kind of setting the roles read, and what users mistype.
ROWS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("port-held-by-another", {"vllm_service_port": 2222},
     ["vllm_service_port", "2222", "glm5-other-app.service"]),
    ("served-name-slash", {"glm5_served_model_name": "glm/5"}, ["glm5_served_model_name", "'glm/5'"]),
    ("served-name-space", {"glm5_served_model_name": "glm 5"}, ["glm5_served_model_name", "'glm 5'"]),
    ("model-dir-dotdot", {"glm5_model_dir": "/srv/models/../../etc/glm5-model"},
     ["glm5_model_dir", "'/srv/models/../../etc/glm5-model'", "not normalized"]),
    ("driver-branch-not-in-repo", {"nvidia_driver_branch": "570"},
     ["nvidia_driver_branch", "'570'", "nvidia-driver-pinning-570", "nvidia-open-570"]),
    ("api-key-newline", {"vllm_service_api_key": f"{SECRET_MARK}\nGLM5_INJECTED=pwned"},
     ["vllm_service_api_key", "the value", "newline"]),
    ("port-0", {"vllm_service_port": 0}, ["vllm_service_port", "0", "1-65535"]),
    ("port-70000", {"vllm_service_port": 70000}, ["vllm_service_port", "70000", "1-65535"]),
    ("gpu-mem-negative", {"vllm_service_gpu_memory_utilization": -0.5},
     ["vllm_service_gpu_memory_utilization", "-0.5"]),
    ("gpu-mem-above-1", {"vllm_service_gpu_memory_utilization": 1.5},
     ["vllm_service_gpu_memory_utilization", "1.5"]),
    ("api-key-empty", {"vllm_service_api_key": ""}, ["vllm_service_api_key is empty"]),
    ("tp-not-dividing-heads", {"glm5_tensor_parallel_size": 3},
     ["glm5_tensor_parallel_size", "= 3", "64 attention heads"]),
    ("cuda-too-old-for-sm120", {"cuda_toolkit_version": "12.4"}, ["cuda_toolkit_version", "'12.4'", "sm_120"]),
    ("driver-branch-unknown", {"nvidia_driver_branch": "555"}, ["nvidia_driver_branch", "'555'", "570, 575, 580"]),
    ("driver-branch-unversioned", {"nvidia_driver_branch": "595"}, ["nvidia_driver_branch", "'595'"]),
    ("negative-jobs", {"flash_attn_max_jobs": -1}, ["flash_attn_max_jobs", "-1"]),
    ("relative-venv-path", {"glm5_venv_path": "opt/ml-env"}, ["glm5_venv_path", "'opt/ml-env'", "relative"]),
    ("vllm-without-patch-set", {"glm5_vllm_version": "0.19.1"},
     ["glm5_vllm_version", "'0.19.1'", "no patch set", "0.20.2"]),
    ("hub-without-token", {"model_source": "hub", "model_hf_token": ""}, ["model_hf_token", "hub"]),
    ("model-dir-etc", {"glm5_model_dir": "/etc"}, ["glm5_model_dir", "'/etc'", "system directory"]),
    ("model-dir-trailing-slash", {"glm5_model_dir": "/srv/models/glm-5/"},
     ["glm5_model_dir", "'/srv/models/glm-5/'", "not normalized"]),
    ("model-dir-double-slash", {"glm5_model_dir": "/srv//models"}, ["glm5_model_dir", "'/srv//models'"]),
    ("model-dir-trailing-dot", {"glm5_model_dir": "/srv/models/."}, ["glm5_model_dir", "'/srv/models/.'"]),
    ("venv-root-opt", {"glm5_venv_root": "/opt"}, ["glm5_venv_root", "'/opt'", "system directory"]),
    ("venv-root-in-proc", {"glm5_venv_root": "/proc/ml-envs"}, ["glm5_venv_root", "'/proc/ml-envs'"]),
    ("dense-context-too-long", {"vllm_service_attention": "dense", "vllm_service_max_model_len": 4096},
     ["vllm_service_max_model_len", "4096", "index_topk 2048"]),
    ("attention-unknown", {"vllm_service_attention": "sliding"}, ["vllm_service_attention", "sliding"]),
    ("firewall-source", {"exposure_allowed_sources": ["10.0.0.0/8; drop"]},
     ["exposure_allowed_sources", "'10.0.0.0/8; drop'"]),
    ("power-limit-50w", {"gpu_tuning_power_limit_w": 50}, ["gpu_tuning_power_limit_w", "50", "100-1000"]),
    ("keep-zero-venvs", {"ml_env_keep": 0}, ["ml_env_keep", "0"]),
    ("reboot-choice", {"nvidia_driver_reboot": "sometimes"}, ["nvidia_driver_reboot", "sometimes"]),
    ("port-not-a-number", {"vllm_service_port": "eighty"}, ["vllm_service_port", "eighty"]),
]


def _docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True).stdout


def snapshot(container: str) -> str:
    prune = " -o ".join(f"-path {p}" for p in SNAPSHOT_PRUNE)
    return _docker(
        "exec", container, "sh", "-c",
        f"find {SNAPSHOT_DIRS} -xdev \\( {prune} \\) -prune -o "
        "-printf '%p %y %s %m %U %G %T@ %l\\n' 2>/dev/null | sort",
        check=False,
    )


def _created(event: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(event["created"])


def refusal_seconds(run: Run, failure: dict[str, Any]) -> float:
    start = next(e for e in run.events if e.get("event") == "playbook_on_start")
    return (_created(failure) - _created(start)).total_seconds()


@pytest.fixture(scope="module")
def host(container: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The container, prepared once (playbooks/validation_host.yml)."""
    run = _runner(container, tmp_path_factory.mktemp("prepare"),
                  str(Path(__file__).parent / "playbooks/validation_host.yml"), {})
    assert run.rc == 0, [e["event_data"].get("res", {}).get("msg") for e in run.task_events()
                         if e["event"] == "runner_on_failed"]
    return container


def _runner(container: str, private: Path, playbook: str, extravars: dict[str, Any],
            cmdline: str | None = None) -> Run:
    inv = private / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_servers:\n      hosts:\n"
        f"        {container}:\n"
        "          ansible_connection: community.docker.docker\n"
        "          ansible_python_interpreter: /usr/bin/python3\n"
    )
    if not (inv / "group_vars").exists():
        (inv / "group_vars").symlink_to(ROOT / "molecule/fixtures/group_vars")
    result = ansible_runner.run(
        private_data_dir=str(private),
        playbook=playbook,
        inventory=str(inv),
        extravars=extravars,
        cmdline=cmdline,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_CACHE_PLUGIN": "memory",
            # The fixture group_vars find the flash-attn stand-in through it.
            "MOLECULE_PROJECT_DIRECTORY": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        },
        quiet=True,
    )
    return Run(rc=result.rc, events=list(result.events))


@pytest.fixture
def site(host: str, tmp_path: Path) -> Callable[..., Run]:
    def _run(extravars: dict[str, Any], playbook: str = "site.yml", cmdline: str | None = None) -> Run:
        return _runner(host, tmp_path, str(ROOT / playbook), extravars, cmdline)

    return _run


def stdout(run: Run) -> str:
    return "".join(e.get("stdout", "") for e in run.events)


def assert_refused_in_validation(run: Run) -> tuple[dict[str, Any], list[str]]:
    assert run.rc != 0, "accepted"
    failure = run.first_failure()
    assert failure["event_data"]["task"] == REFUSE_TASK, failure["event_data"]["task"]
    assert failure["event_data"]["play"] == VALIDATE_PLAY
    assert run.changed_before(failure) == []
    # No play after the validation phase started: nothing of a later phase ran.
    plays = [e["event_data"].get("play") for e in run.events if e.get("event") == "playbook_on_play_start"]
    assert plays == [VALIDATE_PLAY], plays
    lines = str(failure["event_data"]["res"]["msg"]).splitlines()
    return failure, lines


def assert_in_time(run: Run) -> None:
    elapsed = refusal_seconds(run, run.first_failure())
    assert elapsed < ELAPSED_BOUND_S, f"refused {elapsed:.1f} s after the start"


def test_good_settings_pass_the_validation_phase(site, host):
    """The prepared host with the fixture settings passes (the service's own vLLM holds
    its port: fine), so every refusal below is the bad value's."""
    run = site({}, playbook="playbooks/validate.yml")
    assert run.rc == 0, [e["event_data"]["res"].get("msg") for e in run.task_events()
                         if e["event"] == "runner_on_failed"]
    assert "Remember what this run validated on the host" in run.ok_tasks()
    # Every role of the phase table that has checks, in the table's order, chosen once.
    chosen = [e["event_data"]["res"]["ansible_facts"]["glm5__validate"] for e in run.task_events()
              if e["event"] == "runner_on_ok" and e["event_data"]["task"].startswith("Choose the roles to validate")]
    assert chosen == [["nvidia_driver", "cuda_toolkit", "ml_env", "flash_attn", "vllm_patches", "model", "gpu_tuning",
                       "nccl_check", "exposure", "tls_proxy", "gpu_exporter", "vllm_service"]], chosen
    assert not [e for e in run.task_events() if e["event_data"].get("res", {}).get("changed")]


@pytest.fixture(scope="module")
def table(host: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, float]]:
    """Every row of ROWS run once, JOBS at a time (the runs only read the host), with a
    snapshot of the host before and after them all; {row id: (run, wall seconds)}."""
    before = snapshot(host)
    base = tmp_path_factory.mktemp("table")

    def one(row: tuple[str, dict[str, Any], list[str]]) -> tuple[str, tuple[Run, float]]:
        start = time.monotonic()
        run = _runner(host, base / row[0], str(ROOT / "site.yml"), row[1])
        return row[0], (run, time.monotonic() - start)

    with concurrent.futures.ThreadPoolExecutor(max_workers=JOBS) as pool:
        results = dict(pool.map(one, ROWS))
    assert snapshot(host) == before, "the table's runs changed the host"
    return results


@pytest.mark.parametrize(("row_id", "texts"), [(r[0], r[2]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_refused_before_any_change(table, row_id, texts):
    run, _ = table[row_id]
    _, lines = assert_refused_in_validation(run)
    # One line names the variable and the value (and what else the row requires).
    assert any(all(t in line for t in texts) for line in lines), lines
    assert SECRET_MARK not in stdout(run)
    assert_in_time(run)


def test_table_timing(table):
    """Reports the refusal times (seconds from the playbook's start); the bound itself
    is asserted per row."""
    times = sorted(refusal_seconds(run, run.first_failure()) for run, _ in table.values())
    walls = sorted(wall for _, wall in table.values())
    print(f"refusal after start: median {statistics.median(times):.1f} s, max {max(times):.1f} s; "
          f"wall per run: median {statistics.median(walls):.1f} s ({len(times)} runs, {JOBS} at a time)")
    assert len(times) >= 25


def test_several_bad_values_one_line_each(site, host):
    run = site({
        "glm5_served_model_name": "glm 5",
        "vllm_service_port": 70000,
        "vllm_service_gpu_memory_utilization": 1.5,
        "flash_attn_max_jobs": -1,
        "glm5_model_dir": "/srv/models/../x",
    })
    _, lines = assert_refused_in_validation(run)
    expected = ["glm5_served_model_name", "vllm_service_port (glm5_api_port) = 70000",
                "vllm_service_gpu_memory_utilization = 1.5", "flash_attn_max_jobs = -1", "glm5_model_dir"]
    for text in expected:
        assert len([line for line in lines if text in line]) == 1, (text, lines)
    assert len(lines) == len(expected), lines
    assert_in_time(run)


def test_only_the_failed_check_is_named(site, host):
    """A bad port alone: one line, and it says nothing of the served name, the key or
    the memory utilization (which are fine)."""
    run = site({"vllm_service_port": 70000})
    _, lines = assert_refused_in_validation(run)
    assert len(lines) == 1, lines
    for fine in ("served", "api_key", "gpu_memory_utilization", "one of these"):
        assert fine not in lines[0]
    assert_in_time(run)


@pytest.mark.parametrize(("playbook", "cmdline"), [("site.yml", "--check --diff"), ("site.yml", "--tags service"),
                                                ("playbooks/service.yml", None)])
def test_check_mode_and_one_phase_are_validated_too(site, host, playbook, cmdline):
    """--check, --tags <phase>, and a phase playbook run on its own: the validation phase
    runs first (tagged always) and refuses."""
    run = site({"vllm_service_port": 0}, playbook=playbook, cmdline=cmdline)
    _, lines = assert_refused_in_validation(run)
    assert any("vllm_service_port" in line for line in lines)
    assert_in_time(run)


def test_port_held_by_another_program_keeps_the_service_up(site, host):
    """vllm_service_port=2222 (glm5-other-app.service holds it): refused in the
    validation phase with the owner named; the unit file is untouched and the running
    service answers during and after the refused run."""
    unit = "/etc/systemd/system/vllm-glm-5.service"
    unit_before = _docker("exec", host, "sha256sum", unit)
    answers: list[int] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            out = subprocess.run(
                ["docker", "exec", host, "python3", "-c",
                 "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000/', timeout=5).status)"],
                capture_output=True, text=True,
            )
            answers.append(int(out.stdout.strip() or 0))
            time.sleep(0.5)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        run = site({"vllm_service_port": 2222})
    finally:
        done.set()
        prober.join()
    _, lines = assert_refused_in_validation(run)
    assert any("vllm_service_port" in line and "2222" in line and "glm5-other-app.service" in line for line in lines)
    assert _docker("exec", host, "sha256sum", unit) == unit_before
    assert answers and set(answers) == {200}, answers
    assert _docker("exec", host, "systemctl", "is-active", "vllm-glm-5.service").strip() == "active"
    after = subprocess.run(
        ["docker", "exec", host, "python3", "-c",
         "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000/', timeout=5).status)"],
        capture_output=True, text=True, check=True,
    )
    assert after.stdout.strip() == "200"
    assert_in_time(run)
