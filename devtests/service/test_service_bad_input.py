"""Bad input to roles model and vllm_service is refused, with a clear message, before
any task changes the host (runner events, check mode on this machine)."""

from __future__ import annotations

import json
import socket

import pytest


def message(event) -> str:
    res = event["event_data"]["res"]
    return str(res.get("msg", "")) + json.dumps(res.get("results", []))


# Every check of tasks/validate.yml adds a line; this task refuses once with them all.
REFUSE = "Refuse the settings that failed a check"


def _refused(run, task: str, text: str) -> None:
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"] == task
    assert text in message(failure), message(failure)
    assert run.changed_before(failure) == []


def test_hub_source_without_token(run_local, tmp_path):
    run = run_local("model_role.yml", {"model_source": "hub", "model_hf_token": "",
                                       "model_dir": str(tmp_path / "m")})
    _refused(run, REFUSE, "model_hf_token is empty while model_source is hub")


def test_served_name_with_spaces(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_served_model_name": "glm 5"})
    _refused(run, REFUSE, "vllm_service_served_model_name (glm5_served_model_name) = 'glm 5' is refused")
    # Only what failed: the key and the port are fine, and not named.
    assert "api_key" not in message(run.first_failure())
    assert "vllm_service_port" not in message(run.first_failure())


def test_missing_api_key(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_api_key": ""})
    _refused(run, REFUSE, "vllm_service_api_key is empty")


def test_tp_not_dividing_heads(run_local, model_files):
    run = run_local("service_role.yml", {**model_files, "vllm_service_tensor_parallel_size": 3})
    _refused(run, REFUSE, "vllm_service_tensor_parallel_size (glm5_tensor_parallel_size) = 3 is refused;"
             " expected a divisor of the model's 64 attention heads")


def test_port_in_use(run_local, model_files):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        run = run_local("service_role.yml", {**model_files, "vllm_service_port": port})
    _refused(run, REFUSE, f"vllm_service_port = {port} is in use by")


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
def test_dense_max_model_len_boundary(run_local, model_files, length, allow, accepted):
    run = run_local("service_validate.yml", {
        **model_files,
        "vllm_service_attention": "dense",
        "vllm_service_max_model_len": length,
        "vllm_service_allow_long_context": allow,
    })
    task = "Check the vllm_service settings"
    if accepted:
        assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
        assert task in " ".join(run.ok_tasks())
    else:
        _refused(run, REFUSE, f"vllm_service_max_model_len = {length} exceeds index_topk 2048")


def _debug_messages(run) -> str:
    return " ".join(str(e["event_data"]["res"].get("msg", "")) for e in run.task_events()
                    if e["event"] == "runner_on_ok" and "res" in e["event_data"])


def test_sparse_is_the_default_with_the_models_own_context(run_local, model_files):
    """No GPU on this machine: the KV-cache bound is unknown, the model's limit is used."""
    run = run_local("service_validate.yml", model_files)
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
    text = _debug_messages(run)
    assert "sparse attention: max_model_len 202752 (default)" in text
    assert "KV cache unknown (no GPU query) tokens" in text


def test_sparse_context_bounded_by_the_kv_cache(run_local, model_files):
    """40 GiB GPUs with 10 GiB of weights per GPU (TP 8): the KV cache bounds the context."""
    gguf = model_files["vllm_service_gguf_path"]
    run = run_local("service_validate.yml", {
        **model_files,
        "model_gguf_files": [gguf],
        "nvidia_driver_gpus": [{"memory_total": "40960 MiB"}] * 8,
        "vllm_service_gpu_memory_utilization": 0.5,
        "vllm_service_kv_reserve_mib": 4096,
    })
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
    # ((40960 x 0.5 - 4096) MiB - 2 bytes of weights) / (78 x (576 x 2 + 132)) bytes = 171,537
    # tokens -> 171,520 (64-token blocks)
    assert "max_model_len 171520 (default)" in _debug_messages(run)
    assert "bounded by the KV cache" in _debug_messages(run)


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"vllm_service_max_model_len": 1024},
         "= 1024 is refused with sparse attention; expected at least index_topk 2048"),
        # No GPU here: the KV cache's bound is unknown, and the line says nothing of it.
        ({"vllm_service_max_model_len": 262144},
         "vllm_service_max_model_len = 262144 is refused; expected at most the model's max_position_embeddings"
         " 202752."),
        ({"vllm_service_max_model_len": 180000, "nvidia_driver_gpus": [{"memory_total": "40960 MiB"}],
          "vllm_service_gpu_memory_utilization": 0.5, "vllm_service_kv_reserve_mib": 4096},
         "= 180000 is refused with sparse attention; expected at most 171537, the tokens the KV cache of one GPU"
         " holds at gpu_memory_utilization 0.5"),
    ],
    ids=["below-index-topk", "above-model-limit", "above-kv-cache"],
)
def test_sparse_context_refused(run_local, model_files, extra, text):
    run = run_local("service_validate.yml", {**model_files, **extra})
    _refused(run, REFUSE, text)
    lines = message(run.first_failure()).split("\n")
    assert len([line for line in lines if "max_model_len" in line]) == 1, lines
    assert "None" not in message(run.first_failure())


@pytest.mark.parametrize(
    ("attention", "backend"),
    [("sparse", "TRITON_MLA"), ("dense", "TRITON_MLA_SPARSE"), ("fast", "")],
)
def test_attention_and_backend_must_match(run_local, model_files, attention, backend):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_attention": attention,
                                             "vllm_service_attention_backend": backend})
    assert run.rc != 0
    failure = run.first_failure()
    task = failure["event_data"]["task"]
    # "fast" is refused by the argument specs (choices), the mismatches by validate.yml
    assert task == REFUSE
    assert "vllm_service_attention" in message(failure)
    assert run.changed_before(failure) == []




def test_api_key_with_newline_refused_without_printing_it(run_local, model_files):
    """A key with a newline would end the env file's assignment and add a
    variable of the attacker's choice; refused, naming the variable and "the value"."""
    key = "devtest-secret-4b1c\nGLM5_INJECTED=pwned"
    run = run_local("service_validate.yml", {**model_files, "vllm_service_api_key": key})
    _refused(run, REFUSE, "vllm_service_api_key: the value contains a newline")
    text = json.dumps(run.events)
    assert "devtest-secret-4b1c" not in text
    assert "GLM5_INJECTED" not in text


@pytest.mark.parametrize("tokens", [4, -1, "two"], ids=["4", "negative", "word"])
def test_mtp_tokens_outside_0_to_3_refused(run_local, model_files, tokens):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_mtp_tokens": tokens})
    _refused(run, REFUSE, "vllm_service_mtp_tokens")
    assert str(tokens) in message(run.first_failure())


def test_mtp_with_a_speculative_config_in_extra_args_refused(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_mtp_tokens": 2,
                                             "vllm_service_extra_args": ["--speculative_config={}"]})
    _refused(run, REFUSE, "vllm_service_extra_args sets --speculative-config while vllm_service_mtp_tokens = 2;"
             " expected no --speculative-config there (the role renders it from vllm_service_mtp_tokens).")


def test_mtp_tokens_refused_by_argument_specs(run_local, model_files):
    """The role run on its own (no validation phase before it): Ansible's check of the
    role's argument spec refuses first, before any task."""
    run = run_local("service_role.yml", {**model_files, "vllm_service_mtp_tokens": 5})
    assert run.rc != 0
    failure = run.first_failure()
    assert failure["event_data"]["task"].startswith("Validating arguments against arg spec 'main'")
    assert "vllm_service_mtp_tokens" in message(failure)
    assert run.changed_before(failure) == []


def test_mtp_tokens_accepted(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_mtp_tokens": 3})
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]


def test_sparse_context_bounded_by_an_fp8_kv_cache(run_local, model_files):
    """The same 40 GiB GPUs with an fp8 latent cache (patch 0013, 656 instead of 1,152
    bytes per token and layer): the bound grows by 1,284 / 788."""
    gguf = model_files["vllm_service_gguf_path"]
    run = run_local("service_validate.yml", {
        **model_files,
        "model_gguf_files": [gguf],
        "nvidia_driver_gpus": [{"memory_total": "40960 MiB"}] * 8,
        "vllm_service_gpu_memory_utilization": 0.35,
        "vllm_service_kv_reserve_mib": 4096,
        "vllm_service_kv_cache_dtype": "fp8",
    })
    assert run.rc == 0, [message(e) for e in run.task_events() if e["event"] == "runner_on_failed"]
    # (40960 x 0.35 - 4096) MiB / (78 x (656 + 132)) bytes = 174,694 tokens -> 174,656
    # (bf16: 78 x (1,152 + 132) bytes, 107,211 tokens)
    text = _debug_messages(run)
    assert "max_model_len 174656 (default)" in text
    assert "61464 bytes per token per GPU (kv cache fp8: 656 latent" in text


def test_sparse_fp8_cache_with_mtp_refused(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_kv_cache_dtype": "fp8_e4m3",
                                             "vllm_service_mtp_tokens": 1})
    _refused(run, REFUSE, "vllm_service_kv_cache_dtype = fp8_e4m3 is refused with vllm_service_mtp_tokens = 1")


def test_kv_cache_dtype_without_a_layout_refused(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_kv_cache_dtype": "fp8_e5m2"})
    _refused(run, REFUSE, "vllm_service_kv_cache_dtype")
    assert "fp8_e5m2" in message(run.first_failure())


def test_kv_cache_dtype_in_extra_args_refused(run_local, model_files):
    run = run_local("service_validate.yml", {**model_files, "vllm_service_extra_args": ["--kv_cache_dtype=fp8"]})
    _refused(run, REFUSE, "vllm_service_extra_args sets --kv-cache-dtype, which the role sets itself")
