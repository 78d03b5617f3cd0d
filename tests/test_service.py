"""Post-deploy checks of the vLLM service (role vllm_service).

In the molecule containers the unit runs vllm_probe_standin (a test double of
`vllm serve`, there is no GPU); the checks here hold for both. GPU-only checks skip
with a reason where there is no GPU.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from conftest import ansible_var

# Recorded in docs/service.md; a hardening regression raises the score.
MAX_EXPOSURE = 3.6
FORBIDDEN = ("PrivateDevices=yes", "ProcSubset=pid", "MemoryDenyWriteExecute=yes",
             "SystemCallFilter=", "RestrictAddressFamilies=")


def test_unit_enabled_and_active(host, service):
    unit = host.service(f"{service.unit}.service")
    assert unit.is_enabled
    assert unit.is_running


def test_unit_verifies(host, service):
    cmd = host.run(f"systemd-analyze verify /etc/systemd/system/{service.unit}.service")
    assert cmd.rc == 0, cmd.stderr
    assert f"{service.unit}.service:" not in cmd.stderr


def _backend(host) -> str:
    """The --attention-backend of the inventory's vllm_service_attention (role default sparse)."""
    return {"sparse": "TRITON_MLA_SPARSE", "dense": "TRITON_MLA"}[ansible_var(host, "vllm_service_attention", "sparse")]


def test_unit_hardening_keeps_gpus_working(host, service):
    text = host.file(f"/etc/systemd/system/{service.unit}.service").content_string
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "DevicePolicy=closed", "DeviceAllow=char-nvidia-uvm rw",
                 "DeviceAllow=char-nvidiactl rw", "Restart=on-failure", "Environment=\"HF_HUB_OFFLINE=1\"",
                 "Environment=\"CUDA_DEVICE_ORDER=PCI_BUS_ID\""):
        assert line in text
    active = [ln for ln in text.splitlines() if not ln.startswith("#")]
    for bad in FORBIDDEN:
        assert not any(ln.startswith(bad) for ln in active), bad
    argv = _exec_start(host, service)
    assert argv[argv.index("--attention-backend") + 1] == _backend(host), argv


def test_exposure_score(host, service):
    cmd = host.run(f"systemd-analyze security --no-pager {service.unit}.service")
    assert cmd.rc == 0, cmd.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", cmd.stdout)
    assert m, cmd.stdout[-500:]
    assert float(m.group(1)) <= MAX_EXPOSURE, cmd.stdout[-300:]


def test_env_file_holds_the_key_mode_0600(host, service):
    env = host.file(f"/etc/glm5/{service.unit}.env")
    assert env.user == "root"
    assert env.mode == 0o600
    if service.api_key:
        # Double-quoted for systemd's EnvironmentFile= parser (role glm5's glm5_systemd_quote).
        quoted = re.sub(r'([\\"`$])', r"\\\1", service.api_key)
        assert f'VLLM_API_KEY="{quoted}"' in env.content_string.splitlines()
        for path in (f"/etc/systemd/system/{service.unit}.service", f"/etc/glm5/{service.unit}.cmdline"):
            assert service.api_key not in host.file(path).content_string
        pid = host.run(f"systemctl show -p MainPID --value {service.unit}.service").stdout.strip()
        cmdline = host.file(f"/proc/{pid}/cmdline").content_string
        assert service.api_key not in cmdline
        # What systemd read back from the env file is the key, byte for byte.
        environ = host.run(f"cat /proc/{pid}/environ").stdout.split("\x00")
        assert [e for e in environ if e.startswith("VLLM_API_KEY=")] == [f"VLLM_API_KEY={service.api_key}"]


def test_runs_as_service_user(host, service):
    user = host.run(f"systemctl show -p User --value {service.unit}.service").stdout.strip()
    assert user and user != "root"
    pid = host.run(f"systemctl show -p MainPID --value {service.unit}.service").stdout.strip()
    status = host.file(f"/proc/{pid}/status").content_string
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert uid and uid.group(1) != "0"


def test_port_listens_only_on_configured_address(host, service):
    out = host.run(f"ss -Htln 'sport = :{service.port}'").stdout
    locals_ = {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in out.splitlines() if line.strip()}
    assert locals_, f"nothing listens on port {service.port}"
    expected = {service.host, "*"} if service.host in {"0.0.0.0", "::"} else {service.host}
    assert locals_ <= expected | ({"0.0.0.0", "::", "*"} if service.host in {"0.0.0.0", "::"} else set())


def test_health(http_get, service):
    assert http_get("/health", service, with_key=False).status == 200


def test_models_without_key_is_401(http_get, service):
    assert http_get("/v1/models", service, with_key=False).status == 401


def test_models_lists_served_name(http_get, service):
    if not service.api_key:
        pytest.skip("no API key: set vllm_service_api_key in the inventory or GLM5_VLLM_API_KEY")
    answer = http_get("/v1/models", service)
    assert answer.status == 200
    assert service.name in [m["id"] for m in answer.json()["data"]]


def test_standin_start_checks_passed(host, service):
    """vllm_probe_standin did what vLLM does at start, under the unit's hardening."""
    report = host.file(f"/var/lib/{service.unit}/vllm_probe_standin-report.json")
    if not report.exists:
        pytest.skip("the unit runs vLLM, not vllm_probe_standin")
    data = json.loads(report.content_string)
    assert data["failed"] == [], data["checks"]


def test_nvidia_devices_allowed(host, service):
    if not service.gpu_required:
        pytest.skip("no GPU on this host (glm5_gpu_required: false)")
    names = {ln.split()[1] for ln in host.file("/proc/devices").content_string.splitlines()
             if len(ln.split()) == 2 and ln.split()[1].startswith("nvidia")}
    text = host.file(f"/etc/systemd/system/{service.unit}.service").content_string
    missing = [n for n in names if f"DeviceAllow=char-{n} rw" not in text]
    assert not missing, f"/proc/devices NVIDIA groups not allowed: {missing}"


def test_attention_backend_in_startup_log(host, service):
    if not service.gpu_required:
        pytest.skip("no GPU on this host: vLLM does not run here, its log has no backend line")
    inv = host.run(f"systemctl show -p InvocationID --value {service.unit}.service").stdout.strip()
    log = host.run(f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={inv}").stdout
    backend = _backend(host)
    assert re.search(rf"AttentionBackendEnum\.{backend} backend", log), f"startup log does not show {backend}"


def _exec_start(host, service) -> list[str]:
    text = host.file(f"/etc/systemd/system/{service.unit}.service").content_string
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    # Each word double-quoted by role glm5's glm5_systemd_exec_args: \\ and \" escaped (shlex
    # undoes them), % and $ doubled (specifiers, variable expansion).
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line.removeprefix("ExecStart="))]


def test_guarded_flags_once_and_context_capped(host, service):
    """Each flag the role guards appears once on the command line (no
    override from vllm_service_extra_args); with dense attention --max-model-len is at
    most index_topk unless vllm_service_allow_long_context, with sparse at least index_topk
    (the model's limit bounded by the KV cache: role vllm_service's validate.yml)."""
    argv = _exec_start(host, service)
    words = [w.split("=", 1)[0].replace("_", "-") for w in argv if w.startswith("--")]
    for flag in ("--max-model-len", "--tensor-parallel-size", "--attention-backend", "--host", "--port",
                 "--served-model-name"):
        assert words.count(flag) == 1, (flag, argv)
    assert "--api-key" not in words and "-tp" not in argv
    length = int(argv[argv.index("--max-model-len") + 1])
    topk = int(ansible_var(host, "vllm_service_index_topk", None) or ansible_var(host, "glm5_index_topk", 2048))
    allow = str(ansible_var(host, "vllm_service_allow_long_context", False)).lower() in ("true", "1", "yes")
    if ansible_var(host, "vllm_service_attention", "sparse") == "dense":
        assert length <= topk or allow, f"--max-model-len {length} > index_topk {topk}"
    else:
        assert length >= topk, f"sparse attention with --max-model-len {length} < index_topk {topk}"
    fmt = ansible_var(host, "vllm_service_chat_template_content_format", "string")
    if fmt:
        assert argv[argv.index("--chat-template-content-format") + 1] == fmt


def test_unit_environment_has_nccl_settings(host, service):
    """NCCL's and gloo's sockets on the configured interface (lo: one
    host), and the fallback role nccl_check recorded (/etc/glm5/nccl-check.json) in the
    running unit's environment; without a recorded fallback, no NCCL_P2P_* variable."""
    shown = host.run(f"systemctl show -p Environment --value {service.unit}.service")
    assert shown.rc == 0, shown.stderr
    env = dict(pair.split("=", 1) for pair in shlex.split(shown.stdout) if "=" in pair)
    ifname = ansible_var(host, "vllm_service_socket_ifname", "lo")
    if ifname:
        assert env.get("NCCL_SOCKET_IFNAME") == ifname and env.get("GLOO_SOCKET_IFNAME") == ifname, env
    record_file = ansible_var(host, "nccl_check_record_file", "/etc/glm5/nccl-check.json")
    record = host.file(record_file)
    recorded = json.loads(record.content_string)["environment"] if record.exists else {}
    for key, value in recorded.items():
        assert env.get(key) == value, (key, env)
    extra = ansible_var(host, "vllm_service_environment", {}) or {}
    assert not [k for k in env if k.startswith("NCCL_P2P") and k not in recorded and k not in extra], env
