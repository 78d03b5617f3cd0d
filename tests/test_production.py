"""Post-deploy checks of the production phase (gpu_tuning, nccl_check, exposure).

GPU checks skip, with a reason, on hosts without nvidia-smi (the molecule
containers). The API's address and port come from the ``service`` fixture (the
inventory through role glm5's one derivation, or GLM5_VLLM_HOST / GLM5_VLLM_PORT).
Environment: GLM5_SERVED_MODEL_NAME (glm-5), GLM5_KERNEL_ARGS (iommu=pt).
"""

import os

import pytest

NAME = os.environ.get("GLM5_SERVED_MODEL_NAME", "glm-5")
KERNEL_ARGS = os.environ.get("GLM5_KERNEL_ARGS", "iommu=pt").split()
UNIT = f"vllm-{NAME}.service"


def _gpu(host):
    if not host.exists("nvidia-smi"):
        pytest.skip("no nvidia-smi on this host (no GPU): GPU checks run on the GPU machine")


def _service_up(host):
    svc = host.service(UNIT)
    if not host.file(f"/etc/systemd/system/{UNIT}").exists or not svc.is_running:
        pytest.skip(f"{UNIT} is not running on this host")


def test_production_grub_dropin(host):
    dropin = host.file("/etc/default/grub.d/60-glm5-gpu.cfg")
    assert dropin.exists and dropin.mode == 0o644
    for arg in KERNEL_ARGS:
        assert arg in dropin.content_string


def test_production_kernel_args_active(host):
    _gpu(host)
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert set(KERNEL_ARGS) <= set(cmdline), f"reboot pending? /proc/cmdline: {cmdline}"


def test_production_power_unit_enabled(host):
    assert host.service("glm5-gpu-power.service").is_enabled
    assert host.file("/etc/glm5/gpu-power.json").exists


def test_production_power_in_effect(host):
    _gpu(host)
    out = host.run("/usr/bin/python3 /usr/local/libexec/glm5/glm5_gpu_power.py --check")
    assert out.rc == 0, out.stderr
    assert "persistence True" in out.stdout


def test_production_acs_unit(host):
    unit = host.file("/etc/systemd/system/glm5-acs-disable.service")
    if not unit.exists:
        pytest.skip("gpu_tuning_acs_disable is false on this host")
    svc = host.service("glm5-acs-disable.service")
    assert svc.is_enabled
    assert host.run("systemctl is-failed glm5-acs-disable.service").stdout.strip() != "failed"


def test_production_nccl_check_shipped(host):
    assert host.file("/usr/local/lib/glm5-tools/glm5_tools/nccl_check/core.py").exists


def test_production_firewall_table(host, service):
    assert host.service("glm5-exposure-firewall.service").is_enabled
    table = host.run("nft list table inet glm5_exposure")
    assert table.rc == 0, table.stderr
    assert f"{service.port}" in table.stdout
    assert "drop" in table.stdout
    assert 'iifname "lo"' in table.stdout


def test_production_journald_retention(host):
    conf = host.file("/etc/systemd/journald.conf.d/60-glm5.conf").content_string
    assert "SystemMaxUse=" in conf and "MaxRetentionSec=" in conf


def test_production_request_logging_off(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}")
    if not unit.exists:
        pytest.skip(f"{UNIT} is not installed on this host")
    assert "--enable-log-requests" not in unit.content_string
    assert "--enable-log-outputs" not in unit.content_string


def test_production_bind_address(host, service):
    _service_up(host)
    port, api_host = service.port, service.host
    listening = host.run(f"ss -ltnH 'sport = :{port}'").stdout.split()
    assert any(word.startswith(api_host) or word == f"[{api_host}]:{port}" for word in listening), (
        f"port {port} not bound to {api_host}: {listening}"
    )


def test_production_metrics(host, service):
    _service_up(host)
    if service.standin:
        pytest.skip("the unit runs vllm_probe_standin (test double), which has no vLLM metrics")
    url = f"{service.base_url}/metrics"
    out = host.run(
        "python3 -c 'import sys, urllib.request; "
        f'sys.stdout.write(urllib.request.urlopen("{url}", timeout=10).read().decode())\''
    )
    assert out.rc == 0, out.stderr
    assert "vllm:" in out.stdout, "no vllm: metrics on /metrics"
