"""Bad input to roles model and vllm_service is refused, with a clear message, before
any task changes the host (runner events, check mode on this machine)."""

from __future__ import annotations

import json
import socket

import pytest


def message(event) -> str:
    res = event["event_data"]["res"]
    return str(res.get("msg", "")) + json.dumps(res.get("results", []))


def _refused(run, task: str, text: str) -> None:
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == task
    assert text in message(failure)
    assert run.changed_before(failure) == []


def test_hub_source_without_token(run_local, tmp_path):
    run = run_local("model_role.yml", {"model_source": "hub", "model_hf_token": "",
                                       "model_dir": str(tmp_path / "m")})
    _refused(run, "Refuse settings that cannot work", "needs model_hf_token")


def test_served_name_with_spaces(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_served_model_name": "glm 5"})
    _refused(run, "Refuse settings that cannot work", "served name must have no spaces")


def test_missing_api_key(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_api_key": ""})
    _refused(run, "Refuse settings that cannot work", "vllm_service_api_key must be set")


def test_tp_not_dividing_heads(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_tensor_parallel_size": 3})
    _refused(run, "Refuse a tensor-parallel size that does not divide the head count",
             "must divide the model's 64 attention heads")


def test_port_in_use(run_local, model_files):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        run = run_local("service_role.yml", {**model_files, "vllm_service_port": port})
    _refused(run, "Refuse a port another program uses", f"port {port} is in use")


def test_bad_type_refused_by_argument_specs(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_port": "eighty"})
    assert run.rc != 0
    failure = run.first_failure()
    assert "argument" in failure["event_data"]["task"].lower() or "Validating" in failure["event_data"]["task"]
    assert run.changed_before(failure) == []


@pytest.mark.parametrize(
    ("length", "allow", "accepted"),
    [(2048, False, True), (2049, False, False), (2049, True, True)],
    ids=["2048-accepted", "2049-refused", "2049-accepted-with-flag"],
)
def test_max_model_len_boundary(run_local, model_files, length, allow, accepted):
    run = run_local("service_validate.yml", {
        **model_files,
        "vllm_service_max_model_len": length,
        "vllm_service_allow_long_context": allow,
    })
    task = "Refuse a context longer than GLM-5's index_topk unless allowed"
    if accepted:
        assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
        assert task in " ".join(run.ok_tasks())
    else:
        _refused(run, task, "exceeds index_topk 2048")


@pytest.mark.parametrize(
    ("extra_args", "flag", "variable"),
    [
        (["--max-model-len", "131072"], "--max-model-len", "vllm_service_max_model_len"),
        (["--max_model_len=131072"], "--max-model-len", "vllm_service_max_model_len"),
        (["-tp", "4"], "-tp", "vllm_service_tensor_parallel_size"),
        (["--host", "0.0.0.0"], "--host", "vllm_service_host"),
        (["--api-key", "k"], "--api-key", "vllm_service_api_key"),
        (["--attention-backend=FLASH_ATTN"], "--attention-backend", "vllm_service_attention_backend"),
    ],
    ids=["max-model-len", "underscore-equals", "tp-short", "host", "api-key", "backend"],
)
def test_extra_args_setting_a_guarded_flag(run_local, model_files, extra_args, flag, variable):
    """Issue 14 item 4 (failing first): vllm_service_extra_args with --max-model-len 131072
    passed the guard, which read only vllm_service_max_model_len; argparse keeps the last
    value, so the unit would have served 131072 tokens. Now refused before any change,
    naming the variable to set instead (here without vLLM: vllm_service_validate_args is
    false; devtests/ml/service checks the parsed namespace with vLLM's own parser)."""
    run = run_local("service_role.yml", {**model_files, "vllm_service_extra_args": extra_args})
    _refused(run, "Refuse extra arguments that set a flag the role sets", f"sets {flag} (set {variable} instead)")


def test_unguarded_extra_args_pass_validation(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_extra_args": ["--enable-prefix-caching"]})
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
    assert "Refuse extra arguments that set a flag the role sets" in " ".join(run.ok_tasks())
