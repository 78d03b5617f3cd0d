"""Unit tests of roles/glm5/filter_plugins/glm5_validate.py: the one path rule and the
one port rule every check of the validation phase uses, and the refusal lines."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def v() -> ModuleType:
    return load_file(ROOT / "roles/glm5/filter_plugins/glm5_validate.py")


@pytest.mark.parametrize(
    "path",
    ["/opt/ml-env", "/opt/ml-envs", "/srv/models/glm-5", "/var/cache/glm5/uv", "/usr/local/libexec/glm5",
     "/etc/glm5", "/etc/glm5/nccl-check.json", "/usr/local/cuda-13.0", "/home/ops/models", "/tmp/pytest-1/model",
     "/var/lib/glm5/flash-attn-build", "/opt/glm5-test/ca.crt"],
)
def test_accepted(v, path):
    assert v.glm5_path_problem(path, "x") == ""


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("opt/ml-env", "relative"),
        ("./ml-env", "relative"),
        ("", "empty"),
        ("/srv/models/../../etc/glm5-model", "not normalized"),
        ("/srv/models/..", "not normalized"),
        ("/srv//models", "not normalized"),
        ("//srv/models", "not normalized"),
        ("/srv/models/.", "not normalized"),
        ("/srv/./models", "not normalized"),
        ("/", "system directory"),
        ("/etc", "system directory"),
        ("/usr", "system directory"),
        ("/usr/local", "system directory"),
        ("/boot", "system directory"),
        ("/proc", "system directory"),
        ("/sys", "system directory"),
        ("/dev", "system directory"),
        ("/bin", "system directory"),
        ("/sbin", "system directory"),
        ("/lib", "system directory"),
        ("/lib64", "system directory"),
        ("/var", "system directory"),
        ("/var/lib", "system directory"),
        ("/run", "system directory"),
        ("/opt", "system directory"),
        ("/srv", "system directory"),
        ("/home", "system directory"),
        ("/root", "system directory"),
        ("/proc/ml-envs", "inside the system directory /proc"),
        ("/sys/fs/x", "inside the system directory /sys"),
        ("/boot/grub/x", "inside the system directory /boot"),
        ("/dev/shm/venv", "inside the system directory /dev"),
        ("/run/glm5", "inside the system directory /run"),
        ("/opt/x\n/etc", "NUL or newline"),
        (17, "not a string"),
    ],
)
def test_refused_names_variable_value_and_form(v, path, why):
    message = v.glm5_path_problem(path, "glm5_model_dir")
    assert message.startswith("glm5_model_dir")
    assert why in message
    if path != "":
        assert repr(path) in message
    assert message.endswith(v.ACCEPTED + ".")
    assert message.count("\n") == 0


def test_empty_allowed_where_it_means_unset(v):
    assert v.glm5_path_problem("", "glm5_ca_bundle", allow_empty=True) == ""
    assert v.glm5_path_problem(None, "glm5_ca_bundle", allow_empty=True) == ""
    assert "relative" in v.glm5_path_problem("ca.crt", "glm5_ca_bundle", allow_empty=True)


@pytest.mark.parametrize("port", [1, 22, 8000, "8000", 65535])
def test_port_accepted(v, port):
    assert v.glm5_port_problem(port, "vllm_service_port") == ""


@pytest.mark.parametrize("port", [0, -1, 65536, 70000, "eighty", "", None, True, 80.5, "8000 "])
def test_port_refused(v, port):
    message = v.glm5_port_problem(port, "vllm_service_port")
    if port == "8000 ":
        assert message == ""  # surrounding blanks are stripped, as int() would
        return
    assert message.startswith(f"vllm_service_port = {port!r} is refused")
    assert "1-65535" in message


def test_port_zero_allowed_where_it_means_none(v):
    assert v.glm5_port_problem(0, "exposure_tls_proxy_port", allow_zero=True) == ""
    assert "or 0 for none" in v.glm5_port_problem(-1, "exposure_tls_proxy_port", allow_zero=True)


def test_refusals_keep_only_failed_checks_one_line_each(v):
    checks = ["", "a = 1 is refused.", ["", "b has 'x'.", "b has 'y'."], None, "a = 1 is refused.", "  "]
    assert v.glm5_refusals(checks) == ["a = 1 is refused.", "b has 'x'.", "b has 'y'."]
    assert v.glm5_refusals([]) == []


def test_refusals_refuse_a_non_list(v):
    with pytest.raises(TypeError):
        v.glm5_refusals("a message")


def test_registered_filters(v):
    assert set(v.FilterModule().filters()) == {
        "glm5_declared_settings", "glm5_host_items", "glm5_host_normalized", "glm5_host_refusals",
        "glm5_host_unnormalized", "glm5_normpath", "glm5_path_problem", "glm5_port_problem", "glm5_refusals",
        "glm5_spec_inputs", "glm5_spec_refusals", "glm5_tp_problem", "glm5_unknown_settings", "glm5_url_problem"}


@pytest.mark.parametrize("path", ["/srv/models/glm-5/", "/srv/models/glm-5//", "/opt/ml-env/"])
def test_trailing_slash_is_the_same_directory(v, path):
    assert v.glm5_path_problem(path, "glm5_model_dir") == ""
    assert v.glm5_normpath(path) == path.rstrip("/")


@pytest.mark.parametrize(("value", "same"), [("/", "/"), ("", ""), (None, None), (8, 8), ("//srv/", "//srv/")])
def test_normpath_leaves_other_values(v, value, same):
    assert v.glm5_normpath(value) == same


def test_trailing_slash_of_a_system_directory_is_still_refused(v):
    assert "system directory" in v.glm5_path_problem("/etc/", "glm5_model_dir")
    assert "system directory" in v.glm5_path_problem("/opt/", "glm5_model_dir")


def test_refusals_leave_out_what_an_earlier_role_refused(v):
    before = ["glm5_tensor_parallel_size = 8.5 is refused; expected a whole number."]
    later = ["vllm_service_tensor_parallel_size (glm5_tensor_parallel_size) = 8.5 is refused; expected a whole number.",
             "nccl_check_world_size (glm5_tensor_parallel_size) = 8.5 is refused; expected 1 or more.",
             "vllm_service_port (glm5_api_port) = 0 is refused; expected a TCP port 1-65535."]
    assert v.glm5_refusals(later, before) == [later[2]]
    # A role variable refused by an earlier role is not refused again under its own name.
    earlier = ["nvidia_driver_branch (glm5_nvidia_driver_branch) = ..."]
    assert v.glm5_refusals(["nvidia_driver_branch = '470' ..."], earlier) == []
    # Two bad items of one list, in one call: both lines stay.
    items = ["exposure_allowed_sources has 'a'; expected CIDRs.", "exposure_allowed_sources has 'b'; expected CIDRs."]
    assert v.glm5_refusals(items, before) == items
    # A line that names no variable first is never left out.
    assert v.glm5_refusals(["the host's architecture x is refused."], ["the host's architecture y"]) == [
        "the host's architecture x is refused."]


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32, 64, "8"])
def test_tp_accepted(v: ModuleType, tp: object) -> None:
    assert v.glm5_tp_problem(tp, "glm5_tensor_parallel_size", 64) == ""
    assert v.glm5_tp_problem(tp, "glm5_tensor_parallel_size", 64, gpu_count=64) == ""


@pytest.mark.parametrize(("tp", "shown"), [(0, "0"), (3, "3"), (-8, "-8"), ("eight", "'eight'"), (None, "None"),
                                           (True, "True"), (128, "128")])
def test_tp_refused_not_a_divisor(v: ModuleType, tp: object, shown: str) -> None:
    message = v.glm5_tp_problem(tp, "glm5_tensor_parallel_size", 64)
    assert message == (f"glm5_tensor_parallel_size = {shown} is refused; expected a divisor of the model's 64"
                       " attention heads (1, 2, 4, 8, 16, 32, 64).")


def test_tp_refused_above_gpu_count(v: ModuleType) -> None:
    message = v.glm5_tp_problem(8, "glm5_tensor_parallel_size", 64, gpu_count=4)
    assert message == "glm5_tensor_parallel_size = 8 exceeds glm5_gpu_count 4; expected at most the host's GPU count."
    # No GPU count given (a host without GPUs required): only the divisor rule.
    assert v.glm5_tp_problem(8, "glm5_tensor_parallel_size", 64, gpu_count=None) == ""


@pytest.mark.parametrize("gpus", [0, -1, "eight", None, True])
def test_tp_not_blamed_for_a_bad_gpu_count(v: ModuleType, gpus: object) -> None:
    """glm5_gpu_count's own line names it; the TP size is not refused for it."""
    assert v.glm5_tp_problem(8, "glm5_tensor_parallel_size", 64, gpu_count=gpus) == ""
