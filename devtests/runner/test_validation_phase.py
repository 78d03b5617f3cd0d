"""The validation phase (playbooks/validate.yml) refuses bad input before anything
changes: site.yml with bad -e values, through ansible-runner, against a systemd container
prepared as a later run finds the host (playbooks/validation_host.yml: NVIDIA's
repository configured from fake_nvidia_repo, the TEST DOUBLE of NVIDIA's repository; a
running vllm-glm-5.service, a TEST DOUBLE of vLLM on port 8000, recorded as role
vllm_service records its units; another program on port 2222; links from /srv and /opt
into /etc, /usr and /proc; the kernel's privileged port range).

Each row of the table is one run with one or more bad values that do not depend on each
other: refused (rc != 0); the first failed task is the validation phase's last one, in
its play, and no other play started; no task reported a change before it; the message
has exactly one line per bad value, each naming the variable and the value (and what
else the row requires), nothing else; a snapshot of /etc /opt /usr/local /srv /var/lib
is the same before and after all rows; the refusal comes within ELAPSED_BOUND_S of the
playbook's start (runner event timestamps). docs/validation-refusals.md lists the rows
with their seconds to refusal (GLM5_VALIDATE_TIMES=<file> writes them).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
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
LONG_NAME = "n" * 300
PATH_FORM = "expected an absolute, normalized path"
RESOLVED_FORM = "expected a path that lies outside the system directories as the host resolves it"
CA_FORM = "expected a file of PEM certificates"

# (id, overrides, one entry per expected line: the texts that line must contain, the
# variable and the value among them). The rows of the first validation table, grouped
# where their settings do not depend on each other, and what users mistype.
ROWS: list[tuple[str, dict[str, Any], list[list[str]]]] = [
    # A port another program holds: named by its command and its unit.
    ("port-held-by-another", {"glm5_api_port": 2222},
     [["vllm_service_port (glm5_api_port) = 2222 is in use by", "http.server 2222", "glm5-other-app.service",
       "not by vllm-glm-5.service"]]),
    ("names-choices-key", {
        "glm5_served_model_name": "glm/5", "vllm_service_api_key": f"{SECRET_MARK}\nGLM5_INJECTED=pwned",
        "exposure_allowed_sources": ["10.0.0.0/8; drop"], "nvidia_driver_reboot": "sometimes",
        "gpu_tuning_power_limit_w": 50},
     [["glm5_served_model_name", "'glm/5'"], ["vllm_service_api_key", "the value", "newline"],
      ["exposure_allowed_sources", "'10.0.0.0/8; drop'"], ["nvidia_driver_reboot", "'sometimes'", "auto, never"],
      ["gpu_tuning_power_limit_w", "50", "100-1000"]]),
    ("ranges", {
        "glm5_served_model_name": "glm 5", "vllm_service_port": 0, "vllm_service_gpu_memory_utilization": -0.5,
        "flash_attn_max_jobs": -1, "ml_env_keep": 0},
     [["glm5_served_model_name", "'glm 5'"], ["vllm_service_port = 0", "1-65535"],
      ["vllm_service_gpu_memory_utilization = -0.5"], ["flash_attn_max_jobs = -1"], ["ml_env_keep = 0"]]),
    ("port-70000-context-size", {
        "vllm_service_port": 70000, "vllm_service_attention": "dense", "vllm_service_max_model_len": 4096,
        "nccl_check_size_mb": -5, "ml_env_uv_link_mode": "move"},
     [["vllm_service_port = 70000", "1-65535"], ["vllm_service_max_model_len", "4096", "index_topk 2048"],
      ["nccl_check_size_mb = -5"], ["ml_env_uv_link_mode = 'move'", "copy, hardlink, clone, symlink"]]),
    ("key-tp-token", {
        "vllm_service_api_key": "", "glm5_tensor_parallel_size": 3, "model_source": "hub", "model_hf_token": ""},
     [["vllm_service_api_key is empty"], ["glm5_tensor_parallel_size", "= 3", "64 attention heads"],
      ["model_hf_token", "hub"]]),
    # Each line blames the setting that was given: the GPU count (not the TP size), the
    # driver branch (not cuda_toolkit_version), the API port (not the TLS proxy's).
    ("blame-the-cause", {
        "glm5_gpu_required": True, "glm5_gpu_count": 0, "glm5_nvidia_driver_branch": "470", "glm5_api_port": 0},
     [["glm5_gpu_count = 0", "1 or more"], ["glm5_nvidia_driver_branch", "'470'", "570, 575, 580"],
      ["glm5_api_port", "= 0", "1-65535"]]),
    ("driver-branch-not-in-repo", {"nvidia_driver_branch": "570"},
     [["nvidia_driver_branch", "'570'", "nvidia-driver-pinning-570", "nvidia-open-570"]]),
    ("driver-branch-unversioned", {"nvidia_driver_branch": "595"}, [["nvidia_driver_branch", "'595'"]]),
    ("cuda-and-vllm-versions", {"cuda_toolkit_version": "12.4", "glm5_vllm_version": "0.19.1"},
     [["cuda_toolkit_version", "'12.4'", "sm_120", "differs from torch's CUDA major 13"],
      ["glm5_vllm_version", "0.19.1", "vllm is pinned to 0.20.2"]]),
    ("attention-firewall-table", {"vllm_service_attention": "sliding", "exposure_nft_table": "1bad"},
     [["vllm_service_attention = 'sliding'", "sparse, dense"], ["exposure_nft_table = '1bad'"]]),
    ("port-not-a-number", {"vllm_service_port": "eighty", "gpu_tuning_power_limit_w": 2000},
     [["vllm_service_port = 'eighty'", "a whole number"], ["gpu_tuning_power_limit_w = 2000"]]),
    # Paths: as written (absolute, normalized, not a system directory) ...
    ("paths-system-and-relative", {
        "glm5_model_dir": "/etc", "glm5_venv_root": "/opt", "exposure_config_dir": "/etc/",
        "glm5_venv_path": "opt/ml-env"},
     [["glm5_model_dir", "'/etc'", "system directory"], ["glm5_venv_root", "'/opt'", "system directory"],
      ["exposure_config_dir", "'/etc/'", "system directory"], ["glm5_venv_path", "'opt/ml-env'", "relative"]]),
    ("paths-not-normalized", {
        "glm5_model_dir": "/srv/models/../../etc/glm5-model", "ml_env_uv_venv": "/srv//uv",
        "flash_attn_build_dir": "/srv/models/.", "glm5_venv_root": "/proc/ml-envs"},
     [["glm5_model_dir", "'/srv/models/../../etc/glm5-model'", "not normalized"],
      ["ml_env_uv_venv", "'/srv//uv'", "not normalized"], ["flash_attn_build_dir", "'/srv/models/.'", "not normalized"],
      ["glm5_venv_root", "'/proc/ml-envs'", "inside the system directory /proc"]]),
    # ... and as the host resolves them (symbolic links followed).
    ("model-dir-link-to-etc", {"glm5_model_dir": "/srv/models/evil"},
     [["glm5_model_dir", "'/srv/models/evil' resolves on this host to '/etc'", "a system directory", RESOLVED_FORM]]),
    ("paths-through-links", {
        "glm5_model_dir": "/srv/models/evil/glm5", "glm5_venv_root": "/opt/glm5-usr/ml-envs",
        "nccl_check_tools_dir": "/srv/models/kernel/tools", "gpu_tuning_config_dir": "/srv/models/evil"},
     [["glm5_model_dir", "to '/etc/glm5'", "inside the system directory /etc"],
      ["glm5_venv_root", "to '/usr/ml-envs'", "inside the system directory /usr"],
      ["nccl_check_tools_dir", "to '/proc/tools'", "inside the system directory /proc"],
      ["gpu_tuning_config_dir", "to '/etc'", "a system directory"]]),
    # A trailing '/' on the command line, where no fact can replace it.
    ("venv-path-slash-on-command-line", {"glm5_venv_path": "/opt/ml-env/"},
     [["glm5_venv_path = '/opt/ml-env/'", "command line (-e)", "expected '/opt/ml-env'"]]),
    # The CA bundle as OpenSSL loads it on the host, and URLs (a proxy's password never shown).
    ("ca-bundle-and-urls", {
        "glm5_ca_bundle": "/etc/hostname", "glm5_https_proxy": "not a url",
        "glm5_http_proxy": f"http://alice:{SECRET_MARK}@proxy.example:99999",
        "glm5_pip_index_url": "ftp://mirror.example/simple", "nvidia_driver_repo_key_url": "mirror.example/key.pub"},
     [["glm5_ca_bundle", "'/etc/hostname'", "does not load as a CA bundle", CA_FORM],
      ["glm5_https_proxy = 'not a url'", "space"], ["glm5_http_proxy = 'http://***@proxy.example:99999'", "port"],
      ["glm5_pip_index_url", "'ftp://mirror.example/simple'", "scheme ftp"],
      ["nvidia_driver_repo_key_url", "'mirror.example/key.pub'", "no scheme"]]),
    ("ca-bundle-missing", {"glm5_ca_bundle": "/nonexistent/ca.pem", "ml_env_https_proxy": "http://proxy.example:3128/x"},
     [["glm5_ca_bundle", "'/nonexistent/ca.pem'", "does not exist", CA_FORM],
      ["ml_env_https_proxy", "'http://proxy.example:3128/x'", "no path"]]),
    # Ports a service must not or cannot take: SSH's (nothing listens on 22 here), the
    # privileged range (vLLM runs without capabilities), another service's of the project.
    ("ssh-port", {"glm5_api_port": 22, "glm5_gpu_exporter": True, "glm5_gpu_exporter_port": 22},
     [["glm5_api_port", "= 22 is SSH's port"], ["glm5_gpu_exporter_port", "= 22 is SSH's port"]]),
    ("privileged-and-taken-ports", {
        "glm5_api_port": 80, "glm5_gpu_exporter": True, "glm5_gpu_exporter_port": 8443, "glm5_tls_proxy": True,
        "tls_proxy_certificate_source": "self_signed"},
     [["glm5_api_port", "= 80 is a privileged port", "expected 1024-65535"],
      ["glm5_gpu_exporter_port", "= 8443 is also the port of the TLS proxy (glm5_tls_proxy_port)"]]),
    # Types: one line each, never Ansible's spec dump; integers refused as written.
    ("types", {
        "glm5_tensor_parallel_size": 8.5, "flash_attn_max_jobs": 2.5, "exposure_allowed_sources": "10.0.0.0/8",
        "vllm_service_extra_args": "--enforce-eager", "vllm_service_gpu_memory_utilization": "0.9 "},
     [["glm5_tensor_parallel_size = 8.5", "a whole number"], ["flash_attn_max_jobs = 2.5"],
      ["exposure_allowed_sources = '10.0.0.0/8'", "a list"], ["vllm_service_extra_args = '--enforce-eager'", "a list"],
      ["vllm_service_gpu_memory_utilization = '0.9 '", "without spaces"]]),
    ("integer-with-a-space", {
        "glm5_tensor_parallel_size": "8 ", "gpu_tuning_locked_clocks": "fast",
        "exposure_journald_max_retention": "forever"},
     [["glm5_tensor_parallel_size = '8 '", "a whole number without spaces (8)"], ["gpu_tuning_locked_clocks = 'fast'"],
      ["exposure_journald_max_retention = 'forever'"]]),
    # Security-relevant vLLM flags and environment (docs/service.md); a secret never shown.
    ("flag-policy", {
        "vllm_service_extra_args": ["--trust-remote", f"--hf-token={SECRET_MARK}", "--enable-prompt-embeds"],
        "vllm_service_environment": {"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "0"}},
     [["vllm_service_extra_args sets --trust-remote (read by vLLM as --trust-remote-code)",
       "vllm_service_allow_trust_remote_code: true"],
      ["vllm_service_extra_args sets --hf-token,"], ["vllm_service_extra_args sets --enable-prompt-embeds"],
      ["vllm_service_environment sets HF_HUB_OFFLINE"], ["vllm_service_environment sets VLLM_SERVER_DEV_MODE"]]),
    ("name-length-empty-dir", {"glm5_served_model_name": LONG_NAME, "glm5_model_dir": ""},
     [["glm5_served_model_name", "is 300 characters long", "at most 233"], ["glm5_model_dir", "is empty", PATH_FORM]]),
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


def _match_lines(lines: list[str], expected: list[list[str]]) -> None:
    """Exactly one line per expected entry, each containing all of its texts."""
    assert len(lines) == len(expected), lines
    unmatched = list(lines)
    for texts in expected:
        hit = next((line for line in unmatched if all(t in line for t in texts)), None)
        assert hit is not None, (texts, lines)
        unmatched.remove(hit)


@pytest.mark.parametrize(("row_id", "expected"), [(r[0], r[2]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_refused_before_any_change(table, row_id, expected):
    run, _ = table[row_id]
    _, lines = assert_refused_in_validation(run)
    _match_lines(lines, expected)
    assert SECRET_MARK not in stdout(run)
    assert_in_time(run)


def test_table_timing(table):
    """Reports the refusal times (seconds from the playbook's start); the bound itself
    is asserted per row. GLM5_VALIDATE_TIMES=<file>: the seconds of each row, as JSON."""
    times = sorted(refusal_seconds(run, run.first_failure()) for run, _ in table.values())
    walls = sorted(wall for _, wall in table.values())
    print(f"refusal after start: median {statistics.median(times):.1f} s, max {max(times):.1f} s; "
          f"wall per run: median {statistics.median(walls):.1f} s ({len(times)} runs, {JOBS} at a time, "
          f"{sum(len(r[2]) for r in ROWS)} bad values)")
    out = os.environ.get("GLM5_VALIDATE_TIMES")
    if out:
        overrides = {r[0]: r[1] for r in ROWS}
        Path(out).write_text(json.dumps(
            {row: {"refusal_s": round(refusal_seconds(run, run.first_failure()), 1), "wall_s": round(wall, 1),
                   "overrides": overrides[row],
                   "lines": str(run.first_failure()["event_data"]["res"]["msg"]).splitlines()}
             for row, (run, wall) in table.items()}, indent=1))
    assert len(times) == len(ROWS)
    assert sum(len(r[2]) for r in ROWS) >= 60


def test_equivalent_and_legitimate_settings_accepted(site, host):
    """What must not be refused: a renamed served model (the port is held by the role's
    own unit under the old name, which the service phase replaces), a model directory
    with a trailing '/' (the same directory: taken without it), --trust-remote-code with
    its switch on; a misspelt variable is a warning naming the nearest declared one."""
    run = site({
        "glm5_served_model_name": "glm-5b",
        "glm5_model_dir": "/srv/models/glm-5/",
        "vllm_service_extra_args": ["--trust-remote-code"],
        "vllm_service_allow_trust_remote_code": True,
        "glm5_tensor_paralel_size": 4,
    }, playbook="playbooks/validate.yml")
    assert run.rc == 0, [e["event_data"]["res"].get("msg") for e in run.task_events()
                         if e["event"] == "runner_on_failed"]
    assert not [e for e in run.task_events() if e["event_data"].get("res", {}).get("changed")]
    assert "glm5_tensor_paralel_size is set, but no role declares it; did you mean glm5_tensor_parallel_size?" in (
        " ".join(stdout(run).split()))
    task = "Take a path written with a trailing '/' as the same path without it"
    # A loop: each item's facts are in the task result's "results".
    normalized = [item.get("ansible_facts", {}) for e in run.task_events()
                  if e["event_data"].get("task") == task and e["event"] == "runner_on_ok"
                  for item in e["event_data"]["res"].get("results", [])]
    assert {"model_dir": "/srv/models/glm-5"} in normalized, normalized


def test_several_bad_values_one_line_each(site, host):
    run = site({
        "glm5_served_model_name": "glm 5",
        "vllm_service_port": 70000,
        "vllm_service_gpu_memory_utilization": 1.5,
        "flash_attn_max_jobs": -1,
        "glm5_model_dir": "/srv/models/../x",
        "glm5_apt_lock_timeout": 0,
    })
    _, lines = assert_refused_in_validation(run)
    expected = ["glm5_served_model_name", "vllm_service_port = 70000",
                "vllm_service_gpu_memory_utilization = 1.5", "flash_attn_max_jobs = -1", "glm5_model_dir",
                "glm5_apt_lock_timeout = '0' is refused; expected whole seconds, 1 or more."]
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
    """glm5_api_port=2222 (glm5-other-app.service holds it): refused in the
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
        run = site({"glm5_api_port": 2222})
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
