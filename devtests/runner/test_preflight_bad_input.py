"""Invalid input is refused by argument_specs, the validation phase or preflight
before any task changes the host: each case runs site.yml through ansible-runner
against a GPU-less systemd container and asserts on the runner's events."""

from __future__ import annotations

import pytest

# What the test container lacks (kernel headers of the host's kernel, a
# 400 GB disk), switched off as a user would.
CONTAINER_VARS = {
    "preflight_check_kernel_headers": False,
    "preflight_check_disk": False,
    "preflight_min_ram_gb": 1,
    # What the validation phase (playbooks/validate.yml, before preflight) requires of
    # every run: an API key and, for the hub, a token (test values, not secrets).
    "vllm_service_api_key": "preflight-test-key-not-a-secret",
    "model_hf_token": "hf_preflight_test_not_a_secret",
}
# The validation phase's refusal (one line per bad value).
VALIDATION = "Refuse the run (one line per bad value; nothing was changed)"


def _message(event) -> str:
    res = event["event_data"]["res"]
    return res.get("msg", "") + "".join(str(r) for r in res.get("results", []))


@pytest.mark.parametrize(
    ("extravars", "failing_task", "message"),
    [
        pytest.param(
            {"glm5_gpu_required": False, "glm5_tensor_parallel_size": 0},
            VALIDATION,
            "(glm5_tensor_parallel_size) = 0 is refused; expected 1 or more.",
            id="tp-zero",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "glm5_gpu_count": 3, "glm5_tensor_parallel_size": 8},
            VALIDATION,
            "nccl_check_world_size (glm5_tensor_parallel_size) = 8 is refused; expected 1 to glm5_gpu_count 3.",
            id="three-gpus-for-tp8",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "glm5_tensor_parallel_size": 3, "glm5_gpu_count": 8},
            VALIDATION,
            "vllm_service_tensor_parallel_size (glm5_tensor_parallel_size) = 3 is refused; expected a divisor of"
            " the model's 64 attention heads",
            id="tp-not-dividing-heads",
        ),
        pytest.param(
            {"glm5_gpu_required": False,
             "preflight_supported_platforms": [{"distribution": "Ubuntu", "versions": ["24.04"]}]},
            "Refuse the host when a preflight check failed",
            "Unsupported OS Debian 13",
            id="unsupported-os",
        ),
        pytest.param(
            {},
            "Refuse the host when a preflight check failed",
            "Found 0 NVIDIA GPU(s) in sysfs (PCI vendor 0x10de), need at least 8",
            id="no-gpus",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "preflight_check_disk": True,
             "preflight_model_size_gb": 1_000_000, "glm5_model_dir": "/srv/models/glm-5"},
            "Refuse the host when a preflight check failed",
            "GB plus a 50 GB margin",
            id="disk-too-small",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "preflight_min_ram_gb": 1_000_000},
            "Refuse the host when a preflight check failed",
            "GiB of memory; need at least 1000000 GiB",
            id="ram-too-small",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "glm5_offline_bundle_dir": "/srv/glm5-offline-bundle"},
            VALIDATION,
            "glm5_offline_bundle_sha256 = '' is refused while glm5_offline_bundle_dir is set",
            id="offline-without-sha256",
        ),
        pytest.param(
            {"glm5_gpu_required": False, "glm5_offline_bundle_dir": "/srv/no-such-bundle",
             "glm5_offline_bundle_sha256": "0" * 64},
            # The validation phase: role nvidia_driver verifies the bundle it installs from.
            "Verify the offline bundle against its manifest (what this role consumes)",
            "offline bundle directory /srv/no-such-bundle does not exist on this host",
            id="offline-bundle-missing",
        ),
        pytest.param(
            {"glm5_tensor_parallel_size": "eight"},
            VALIDATION,
            "glm5_tensor_parallel_size = 'eight' is refused; expected a whole number.",
            id="tp-not-an-int",
        ),
    ],
)
def test_refused_before_any_change(run_playbook, extravars, failing_task, message):
    run = run_playbook("site.yml", {**CONTAINER_VARS, **extravars})
    assert run.rc != 0
    failure = run.first_failure()
    assert failing_task in failure["event_data"]["task"]
    assert message in _message(failure)
    assert run.changed_before(failure) == []


def test_preflight_passes_without_gpu_requirement(run_playbook):
    # The disk check on, against what the container really has free.
    run = run_playbook("playbooks/preflight.yml", {
        **CONTAINER_VARS, "glm5_gpu_required": False, "preflight_check_disk": True,
        "preflight_model_size_gb": 1, "preflight_disk_margin_gb": 1,
    })
    assert run.rc == 0, [e["event_data"].get("res") for e in run.task_events()
                         if e["event"] == "runner_on_failed"]
    passed = [e for e in run.task_events()
              if e["event"] == "runner_on_ok" and e["event_data"].get("task") == "Report preflight passed"]
    assert passed and "Preflight passed" in passed[0]["event_data"]["res"]["msg"]
    assert not any(e["event_data"].get("res", {}).get("changed") for e in run.task_events())
