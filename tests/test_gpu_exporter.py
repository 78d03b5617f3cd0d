"""Post-deploy checks of the GPU metrics exporter (role gpu_exporter, glm5_gpu_exporter).

They skip with a reason where the exporter is off; then they check only that no
exporter unit is left behind. On a GPU host the scrape is compared with nvidia-smi
itself; in the molecule containers the exporter runs fake_nvidia_smi (a test double
printing nvidia-smi output recorded on the GPU validation machine), and the scrape is
compared with that recording.
"""

from __future__ import annotations

import csv
import re

import pytest
from prom_text import names, parse, value

# `systemd-analyze security` of glm5-gpu-exporter.service, measured in molecule/exposure
# (systemd 257, Debian 13): docs/production.md. A hardening regression raises it.
MAX_EXPOSURE = 1.4
HARDENING = ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
             "PrivateTmp=yes", "CapabilityBoundingSet=", "DevicePolicy=closed", "DeviceAllow=char-nvidiactl rw",
             "MemoryDenyWriteExecute=yes", "SystemCallFilter=@system-service")


@pytest.fixture
def exporter(gpu_exporter):
    if not gpu_exporter.enabled:
        pytest.skip("glm5_gpu_exporter is false on this host: no GPU exporter")
    return gpu_exporter


def _scrape(host, url):
    run = host.run(
        "python3 -c 'import sys, urllib.request as u; a = u.urlopen(sys.argv[1], timeout=30); "
        'print(a.headers["Content-Type"]); sys.stdout.write(a.read().decode())\' ' + url
    )
    assert run.rc == 0, run.stderr
    ctype, _, body = run.stdout.partition("\n")
    return ctype, body


def test_gpu_exporter_absent_when_off(host, gpu_exporter):
    if gpu_exporter.enabled:
        pytest.skip("glm5_gpu_exporter is true on this host")
    assert not host.file(f"/etc/systemd/system/{gpu_exporter.unit}.service").exists


def test_gpu_exporter_unit_hardened_and_unprivileged(host, exporter):
    svc = host.service(f"{exporter.unit}.service")
    assert svc.is_enabled and svc.is_running
    text = host.file(f"/etc/systemd/system/{exporter.unit}.service").content_string
    for line in HARDENING:
        assert any(ln.strip() == line for ln in text.splitlines()), line
    pid = host.run(f"systemctl show -p MainPID --value {exporter.unit}.service").stdout.strip()
    uid = re.search(r"^Uid:\s+(\d+)", host.file(f"/proc/{pid}/status").content_string, re.M)
    assert uid and uid.group(1) != "0"


def test_gpu_exporter_exposure_score(host, exporter):
    run = host.run(f"systemd-analyze security --no-pager {exporter.unit}.service")
    assert run.rc == 0, run.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", run.stdout)
    assert m, run.stdout[-500:]
    assert float(m.group(1)) <= MAX_EXPOSURE, run.stdout[-300:]


def test_gpu_exporter_serves_prometheus_text(host, exporter):
    ctype, body = _scrape(host, exporter.url)
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    samples, types = parse(body)
    assert types["glm5_gpu_up"] == "gauge"
    assert value(samples, "glm5_gpu_up") in (0, 1)


def test_gpu_exporter_matches_nvidia_smi(host, exporter):
    """On a GPU host: the GPUs nvidia-smi lists, with their memory size."""
    if exporter.double:
        pytest.skip("the exporter runs fake_nvidia_smi (test double): see the recording check")
    if not host.exists("nvidia-smi"):
        pytest.skip("no nvidia-smi on this host (no GPU)")
    truth = host.run("nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits")
    assert truth.rc == 0, truth.stderr
    samples = parse(_scrape(host, exporter.url)[1])[0]
    assert value(samples, "glm5_gpu_up") == 1
    rows = list(csv.reader(truth.stdout.splitlines(), skipinitialspace=True))
    assert value(samples, "glm5_gpu_count") == len(rows)
    for index, uuid, total in rows:
        assert value(samples, "glm5_gpu_memory_total_bytes", gpu=index, uuid=uuid) == int(total) * 2**20


def _recording(host, exporter):
    """The recorded rows fake_nvidia_smi answers from, as {column without unit: value} per GPU."""
    text = host.file(f"{exporter.nvidia_smi.rsplit('/', 1)[0]}/recording/query.csv").content_string
    rows = list(csv.reader(text.splitlines(), skipinitialspace=True))
    header = [re.sub(r"\s*\[[^]]*\]$", "", h) for h in rows[0]]
    return [dict(zip(header, row, strict=True)) for row in rows[1:]]


def test_gpu_exporter_reports_the_recording(host, exporter):
    if not exporter.double:
        pytest.skip("the exporter runs the real nvidia-smi")
    samples = parse(_scrape(host, exporter.url)[1])[0]
    recorded = _recording(host, exporter)
    assert value(samples, "glm5_gpu_up") == 1
    assert value(samples, "glm5_gpu_count") == len(recorded)
    for gpu in recorded:
        ids = {"gpu": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"]}
        assert value(samples, "glm5_gpu_memory_total_bytes", **ids) == float(gpu["memory.total"]) * 2**20
        assert value(samples, "glm5_gpu_memory_used_bytes", **ids) == float(gpu["memory.used"]) * 2**20
        assert value(samples, "glm5_gpu_temperature_celsius", **ids) == float(gpu["temperature.gpu"])
        assert value(samples, "glm5_gpu_power_draw_watts", **ids) == pytest.approx(float(gpu["power.draw"]))
        assert value(samples, "glm5_gpu_power_limit_watts", **ids) == pytest.approx(float(gpu["power.limit"]))
        assert value(samples, "glm5_gpu_sm_clock_hertz", **ids) == float(gpu["clocks.current.sm"]) * 1e6
        assert value(samples, "glm5_gpu_utilization_ratio", **ids) == float(gpu["utilization.gpu"]) / 100
        assert value(samples, "glm5_gpu_persistence_mode", **ids) == (gpu["persistence_mode"] == "Enabled")
        assert value(samples, "glm5_gpu_info", **ids, pci_bus_id=gpu["pci.bus_id"]) == 1
        if gpu["fan.speed"].startswith("["):
            assert "glm5_gpu_fan_speed_ratio" not in names(samples)


def test_gpu_exporter_driver_failure_reports_up_0(host, exporter):
    """The running exporter, when nvidia-smi cannot reach the driver: up 0, no GPU series, still serving."""
    if not exporter.double:
        pytest.skip("needs fake_nvidia_smi (test double) to make nvidia-smi fail")
    mode = f"{exporter.nvidia_smi.rsplit('/', 1)[0]}/mode"
    try:
        assert host.run(f"echo driver_not_loaded > {mode}").rc == 0
        samples = parse(_scrape(host, exporter.url)[1])[0]
        assert value(samples, "glm5_gpu_up") == 0
        assert value(samples, "glm5_gpu_query_error", reason="nvidia_smi_failed") == 1
        assert not any(n.startswith("glm5_gpu_memory") for n in names(samples))
    finally:
        host.run(f"rm -f {mode}")
    assert value(parse(_scrape(host, exporter.url)[1])[0], "glm5_gpu_up") == 1
    assert host.service(f"{exporter.unit}.service").is_running


def test_gpu_exporter_without_nvidia_smi(host, exporter):
    """The shipped program on a host without nvidia-smi: up 0, exit 0."""
    run = host.run(f"python3 {exporter.script} --once --nvidia-smi /nonexistent/nvidia-smi")
    assert run.rc == 0, run.stderr
    samples = parse(run.stdout)[0]
    assert value(samples, "glm5_gpu_up") == 0
    assert value(samples, "glm5_gpu_query_error", reason="nvidia_smi_missing") == 1


def test_gpu_exporter_port_in_firewall(host, exporter):
    table = host.run("nft list table inet glm5_exposure")
    if table.rc != 0:
        pytest.skip("no exposure firewall on this host (exposure_firewall: false)")
    admitted = re.search(r"ip saddr @allowed_v4 tcp dport \{? ?([0-9, ]+?) ?\}? accept", table.stdout)
    assert admitted and exporter.port in {int(p) for p in admitted.group(1).replace(",", " ").split()}
