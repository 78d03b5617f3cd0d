"""The NCCL fallback the peer-to-peer check needed reaches the vLLM unit
by itself, and the unit pins NCCL's and gloo's sockets to the loopback (one host, TP 8).

Failing first: before, role nccl_check published nothing (its defaults only said the
fallback "must also go into the service environment"), so the rendered unit had no
NCCL_P2P_* variable after a check run with nccl_check_p2p_disable, and no
NCCL_SOCKET_IFNAME. Runs the real check (glm5_tools.nccl_check, two ranks) with the gloo
backend on the CPU (.venv-ml's torch), then renders the real unit template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ML_PYTHON = ROOT / ".venv-ml" / "bin" / "python"

pytestmark = pytest.mark.skipif(not ML_PYTHON.exists(), reason="needs .venv-ml (scripts/ml-venv)")


def _run(run_local, model_files, tmp_path: Path, **extra: object) -> tuple[str, dict]:
    unit = tmp_path / "vllm-glm-5.service"
    record = tmp_path / "etc" / "nccl-check.json"
    run = run_local("nccl_service_env.yml", {
        **model_files,
        "nccl_check_enabled": True,
        "nccl_check_backend": "gloo",
        "nccl_check_world_size": 2,
        "nccl_check_size_mb": 1,
        "nccl_check_iterations": 1,
        "nccl_check_min_busbw_gbps": 0.0,
        "nccl_check_python": str(ML_PYTHON),
        "nccl_check_tools_dir": str(ROOT / "src"),
        "nccl_check_record_file": str(record),
        "nccl_devtest_unit": str(unit),
        **extra,
    })
    failed = [e["event_data"]["res"] for e in run.task_events() if e["event"] == "runner_on_failed"]
    assert run.rc == 0, failed
    task = "Publish the NCCL settings the check passed with"
    published = [e["event_data"]["res"]["ansible_facts"]["nccl_check_service_environment"]
                 for e in run.task_events()
                 if e["event"] == "runner_on_ok" and e["event_data"]["task"] == task]
    assert len(published) == 1
    return unit.read_text(), published[0]


def _environment(unit: str) -> dict[str, str]:
    pairs = [line.removeprefix('Environment="').removesuffix('"').split("=", 1)
             for line in unit.splitlines() if line.startswith("Environment=")]
    return {k: v for k, v in pairs}


def test_fallback_reaches_the_unit(run_local, model_files, tmp_path):
    unit, published = _run(run_local, model_files, tmp_path, nccl_check_p2p_disable=True)
    assert published == {"NCCL_P2P_DISABLE": "1"}
    env = _environment(unit)
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"


def test_no_fallback_no_variable(run_local, model_files, tmp_path):
    unit, published = _run(run_local, model_files, tmp_path)
    assert published == {}
    env = _environment(unit)
    assert not [k for k in env if k.startswith("NCCL_P2P")]
    assert env["NCCL_SOCKET_IFNAME"] == "lo"


def test_record_read_when_the_check_did_not_run(run_local, model_files, tmp_path):
    """A later run (e.g. --tags service) reads what nccl_check recorded on the host."""
    record = tmp_path / "recorded.json"
    record.write_text(json.dumps({"environment": {"NCCL_P2P_LEVEL": "PHB"}}))
    unit_path = tmp_path / "unit"
    run = run_local("nccl_service_env.yml", {**model_files, "nccl_check_enabled": False,
                                              "nccl_check_record_file": str(record),
                                              "nccl_devtest_unit": str(unit_path),
                                              "vllm_service_socket_ifname": "eth0"})
    assert run.rc == 0, [e["event_data"]["res"] for e in run.task_events() if e["event"] == "runner_on_failed"]
    env = _environment(unit_path.read_text())
    assert env["NCCL_P2P_LEVEL"] == "PHB"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_environment_overrides_socket_ifname(run_local, model_files, tmp_path):
    unit_path = tmp_path / "unit"
    run = run_local("nccl_service_env.yml", {**model_files, "nccl_check_enabled": False,
                                              "nccl_check_record_file": str(tmp_path / "none.json"),
                                              "nccl_devtest_unit": str(unit_path),
                                              "vllm_service_environment": {"NCCL_SOCKET_IFNAME": "ib0"}})
    assert run.rc == 0
    env = _environment(unit_path.read_text())
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert not [k for k in env if k.startswith("NCCL_P2P")]
