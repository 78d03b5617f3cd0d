"""Bad input to role vllm_router (and a multi-node setting to vllm_service) is refused,
with a message naming the variable and the accepted form, before any task changes the
host (runner events, check mode on this machine). The inventory of run_local puts
localhost in gpu_servers, so by default the router has one backend: localhost."""

from __future__ import annotations

import json

import pytest

KEY = {"vllm_router_api_key": "devtest-key", "vllm_service_api_key": "devtest-key"}
# Every check of a role's tasks/validate.yml adds a line; this task refuses once with them all.
REFUSE = "Refuse the settings that failed a check"


def message(event) -> str:
    res = event["event_data"]["res"]
    return str(res.get("msg", "")) + json.dumps(res.get("results", []))


def _refused(run, task: str, text: str) -> None:
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == task
    assert text in message(failure), message(failure)
    assert run.changed_before(failure) == []


def test_router_without_backends(run_local):
    run = run_local("router_role.yml", {**KEY, "vllm_router_backend_group": "no_such_group"})
    _refused(run, REFUSE, "vllm_router_backends is empty")


@pytest.mark.parametrize("port", [70000])
def test_backend_port_out_of_range(run_local, port):
    backends = [{"host": "gpu09", "address": "192.0.2.9", "port": port}]
    run = run_local("router_role.yml", {**KEY, "vllm_router_backends": backends})
    _refused(run, REFUSE, f"backend gpu09 port (its vllm_service_port) = '{port}' is refused")


def test_unknown_policy(run_local):
    run = run_local("router_role.yml", {**KEY, "vllm_router_policy": "fastest"})
    _refused(run, REFUSE, "vllm_router_policy = 'fastest' is refused; expected one of cache_aware")


def test_loopback_backend_on_another_host(run_local):
    backends = [{"host": "gpu09", "address": "127.0.0.1", "port": 8000}]
    run = run_local("router_role.yml", {**KEY, "vllm_router_backends": backends})
    _refused(run, REFUSE, "backend gpu09 listens on '127.0.0.1'")


def test_open_admin_api(run_local):
    run = run_local("router_role.yml", {**KEY, "vllm_router_host": "0.0.0.0"})
    _refused(run, REFUSE, "vllm_router_host = '0.0.0.0' is refused")


def test_missing_key(run_local):
    run = run_local("router_role.yml", {"vllm_router_api_key": ""})
    _refused(run, REFUSE, "vllm_router_api_key is empty")


def test_backend_key_differs(run_local):
    run = run_local("router_role.yml", {"vllm_router_api_key": "a", "vllm_service_api_key": "b"})
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == REFUSE
    assert "vllm_router_api_key: the value differs" in message(failure)
    # Neither key's value is shown.
    assert "'a'" not in message(failure) and "'b'" not in message(failure)
    assert run.changed_before(failure) == []


def test_extra_args_repeat_a_flag(run_local):
    run = run_local("router_role.yml", {**KEY, "vllm_router_extra_args": ["--policy", "random"]})
    _refused(run, REFUSE, "vllm_router_extra_args sets --policy")


def test_lock_of_another_version(run_local):
    run = run_local("router_role.yml", {**KEY, "vllm_router_version": "0.1.16"})
    _refused(run, REFUSE, "does not pin vllm-router==0.1.16")


@pytest.mark.parametrize("extra", [{"vllm_service_nnodes": 2},
                                   {"vllm_service_extra_args": ["--master_addr=10.0.0.1"]}])
def test_multinode_refused(run_local, model_files, extra):
    run = run_local("service_role.yml", {**model_files, **extra})
    _refused(run, REFUSE, "one replica over several servers is not supported yet")
