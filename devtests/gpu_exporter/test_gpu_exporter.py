"""Role gpu_exporter's exporter: parser and formatter on nvidia-smi output recorded on the
GPU validation machine (H200, driver 580.159.04), the fields boards do not have, every
failure mode a host without GPUs meets, and the HTTP server."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from conftest import FAKE_SMI, RECORDING
from prom_text import names, parse, value

UUID = "GPU-f69e2fbe-440d-94e0-6691-0452f7fd5554"


class Runner:
    """Stands in for subprocess.run: answers each call with the next canned result."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout):
        self.calls.append(argv)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        rc, out = answer
        return subprocess.CompletedProcess(argv, rc, out, "")


def recorded_answer(fake_smi, argv):
    """What nvidia-smi printed on the GPU machine for the exporter's query (through the double)."""
    rc, out = fake_smi.answer(argv[1:], RECORDING, "")
    return subprocess.CompletedProcess(argv, rc, out, "")


def scrape(exporter, runner, fields=None):
    collector = exporter.Collector("/usr/bin/nvidia-smi", 5.0, runner=runner,
                                   **({"fields": fields} if fields else {}))
    text = collector.metrics()
    return parse(text)[0], text, collector


def test_recorded_h200_values(exporter, fake_smi):
    samples, _, _ = scrape(exporter, lambda argv, timeout: recorded_answer(fake_smi, argv))
    gpu = {"gpu": "0", "uuid": UUID, "name": "NVIDIA H200"}
    assert value(samples, "glm5_gpu_up") == 1
    assert value(samples, "glm5_gpu_count") == 1
    # query.csv: 143771 MiB total, 0 used, 35 C, 79.64 W of 700.00 W, SM 345 of 1980 MHz, memory 3201 MHz.
    assert value(samples, "glm5_gpu_memory_total_bytes", **gpu) == 143771 * 1024 * 1024
    assert value(samples, "glm5_gpu_memory_used_bytes", **gpu) == 0
    assert value(samples, "glm5_gpu_temperature_celsius", **gpu) == 35
    assert value(samples, "glm5_gpu_power_draw_watts", **gpu) == pytest.approx(79.64)
    assert value(samples, "glm5_gpu_power_limit_watts", **gpu) == 700
    assert value(samples, "glm5_gpu_sm_clock_hertz", **gpu) == 345e6
    assert value(samples, "glm5_gpu_sm_clock_max_hertz", **gpu) == 1980e6
    assert value(samples, "glm5_gpu_memory_clock_hertz", **gpu) == 3201e6
    assert value(samples, "glm5_gpu_persistence_mode", **gpu) == 1
    assert value(samples, "glm5_gpu_performance_state", **gpu) == 0
    assert value(samples, "glm5_gpu_ecc_mode_enabled", **gpu) == 1
    assert value(samples, "glm5_gpu_ecc_volatile_errors_total", type="uncorrected", **gpu) == 0
    assert value(samples, "glm5_gpu_info", pci_bus_id="00000000:00:06.0", driver_version="580.159.04") == 1


def test_na_field_is_left_out_not_zero(exporter, fake_smi):
    # The H200 (passively cooled) reports fan.speed as [N/A].
    samples, text, _ = scrape(exporter, lambda argv, timeout: recorded_answer(fake_smi, argv))
    assert "glm5_gpu_fan_speed_ratio" not in names(samples)
    assert "glm5_gpu_fan_speed_ratio" not in text  # no HELP/TYPE of an empty family either


def _row(exporter, **overrides):
    """A row for the default query: the recorded H200 values, with some fields replaced."""
    recorded = dict(zip(
        [f.strip() for f in (RECORDING / "query.csv").read_text().splitlines()[0].split(",")],
        [c.strip() for c in (RECORDING / "query.csv").read_text().splitlines()[1].split(",")],
        strict=True,
    ))
    by_query = {
        "clocks.sm": recorded["clocks.current.sm [MHz]"], "clocks.mem": recorded["clocks.current.memory [MHz]"],
        "clocks.max.sm": recorded["clocks.max.sm [MHz]"],
    }
    for key, cell in recorded.items():
        by_query.setdefault(key.split(" [")[0], cell)
    by_query.update(overrides)
    return ", ".join(by_query[f] for f in exporter.DEFAULT_FIELDS) + "\n"


def test_not_supported_and_other_bracketed_values(exporter):
    # Constructed (not recorded): what nvidia-smi prints for fields a board lacks.
    row = _row(exporter, **{
        "ecc.mode.current": "[N/A]",
        "ecc.errors.corrected.volatile.total": "[Not Supported]",
        "ecc.errors.uncorrected.volatile.total": "[Not Supported]",
        "ecc.errors.corrected.aggregate.total": "[Not Supported]",
        "ecc.errors.uncorrected.aggregate.total": "[Not Supported]",
        "power.draw": "[Unknown Error]",
        "temperature.memory": "N/A",
        "fan.speed": "30",
    })
    samples, _, _ = scrape(exporter, Runner((0, row)))
    present = names(samples)
    for gone in ("glm5_gpu_ecc_mode_enabled", "glm5_gpu_ecc_volatile_errors_total",
                 "glm5_gpu_ecc_aggregate_errors_total", "glm5_gpu_power_draw_watts",
                 "glm5_gpu_memory_temperature_celsius"):
        assert gone not in present
    assert value(samples, "glm5_gpu_up") == 1
    assert value(samples, "glm5_gpu_fan_speed_ratio") == pytest.approx(0.30)
    assert value(samples, "glm5_gpu_power_limit_watts") == 700


def test_eight_gpus_each_labelled(exporter):
    rows = "".join(_row(exporter, index=str(i), uuid=f"GPU-{i:08d}", **{"memory.used": str(1000 * i)})
                   for i in range(8))
    samples, _, _ = scrape(exporter, Runner((0, rows)))
    assert value(samples, "glm5_gpu_count") == 8
    for i in range(8):
        assert value(samples, "glm5_gpu_memory_used_bytes", gpu=str(i), uuid=f"GPU-{i:08d}") == 1000 * i * 2**20


def test_label_values_escaped(exporter):
    row = _row(exporter, name='Odd "board" \\ name')
    samples, text, _ = scrape(exporter, Runner((0, row)))
    assert 'name="Odd \\"board\\" \\\\ name"' in text
    assert value(samples, "glm5_gpu_temperature_celsius", name='Odd "board" \\ name') == 35


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (FileNotFoundError(2, "No such file or directory"), "nvidia_smi_missing"),
        (PermissionError(13, "Permission denied"), "nvidia_smi_failed"),
        (subprocess.TimeoutExpired("nvidia-smi", 5), "timeout"),
        ((9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"), "nvidia_smi_failed"),
        ((0, "0, GPU-x, name, 3\n"), "parse_error"),
        ((0, "zero, " + ", ".join(["1"] * 23) + "\n"), "parse_error"),
    ],
    ids=["missing", "not-executable", "hangs", "driver-not-loaded", "short-row", "index-not-a-number"],
)
def test_failure_reports_up_0_and_keeps_serving(exporter, answer, reason):
    runner = Runner(answer, answer)
    samples, _, collector = scrape(exporter, runner)
    assert value(samples, "glm5_gpu_up") == 0
    assert value(samples, "glm5_gpu_query_error", reason=reason) == 1
    assert value(samples, "glm5_gpu_count") == 0
    assert not any(n.startswith("glm5_gpu_memory") for n in names(samples))
    assert value(samples, "glm5_gpu_scrape_errors_total") == 1
    second = parse(collector.metrics())[0]
    assert value(second, "glm5_gpu_scrape_errors_total") == 2


def test_recovers_after_a_failure(exporter):
    runner = Runner((9, "driver not loaded\n"), (0, _row(exporter)))
    collector = exporter.Collector("nvidia-smi", 5.0, runner=runner)
    assert value(parse(collector.metrics())[0], "glm5_gpu_up") == 0
    after = parse(collector.metrics())[0]
    assert value(after, "glm5_gpu_up") == 1
    assert "glm5_gpu_query_error" not in names(after)
    assert value(after, "glm5_gpu_scrape_errors_total") == 1


def test_field_unknown_to_the_driver_is_dropped_once(exporter, fake_smi):
    # The recorded message of nvidia-smi 580 for an unknown field, then a query without it.
    message = (RECORDING / "unknown-field.out").read_text().rpartition("rc=")[0].replace(
        "no.such.field", "temperature.memory")
    fields = list(exporter.DEFAULT_FIELDS)
    without = [f for f in fields if f != "temperature.memory"]
    runner = Runner((2, message), (0, ", ".join(["0"] + ["1"] * (len(without) - 1)) + "\n"),
                    (0, ", ".join(["0"] + ["1"] * (len(without) - 1)) + "\n"))
    collector = exporter.Collector("nvidia-smi", 5.0, runner=runner)
    samples = parse(collector.metrics())[0]
    assert value(samples, "glm5_gpu_up") == 1
    assert "temperature.memory" in runner.calls[0][1] and "temperature.memory" not in runner.calls[1][1]
    collector.metrics()
    assert len(runner.calls) == 3  # the field stays dropped


def test_identity_field_rejected_is_a_failure_not_a_loop(exporter):
    runner = Runner((2, 'Field "uuid" is not a valid field to query.\n'))
    samples, _, _ = scrape(exporter, runner)
    assert value(samples, "glm5_gpu_query_error", reason="nvidia_smi_failed") == 1
    assert len(runner.calls) == 1


def test_double_refuses_what_real_nvidia_smi_refuses(fake_smi):
    rc, out = fake_smi.answer(["--query-gpu=index,not.a.field", "--format=csv,noheader,nounits"], RECORDING, "")
    assert rc == 2 and out.startswith('Field "not.a.field" is not a valid field to query.')
    rc, out = fake_smi.answer(["--query-gpu=index,gpu_uuid,clocks.current.sm", "--format=csv,noheader,nounits"],
                              RECORDING, "")
    assert (rc, out) == (0, f"0, {UUID}, 345\n")  # aliases answer as their canonical field
    rc, _ = fake_smi.answer(["--query-gpu=index,serial", "--format=csv,noheader,nounits"], RECORDING, "")
    assert rc == 2  # known to the driver, not recorded
    assert fake_smi.answer(["--query-gpu=index", "--format=csv,noheader,nounits"], RECORDING,
                           "driver_not_loaded")[0] == 9


def _serve(exporter, nvidia_smi: str):
    collector = exporter.Collector(nvidia_smi, 10.0)
    server = exporter.make_server("127.0.0.1", 0, collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _get(server, path):
    url = f"http://127.0.0.1:{server.server_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_http_server_against_the_double(exporter):
    server = _serve(exporter, str(FAKE_SMI))
    try:
        status, ctype, body = _get(server, "/metrics")
        assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
        samples = parse(body)[0]
        assert value(samples, "glm5_gpu_up") == 1
        assert value(samples, "glm5_gpu_memory_total_bytes", uuid=UUID) == 143771 * 2**20
        assert _get(server, "/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_http_server_without_nvidia_smi(exporter, tmp_path):
    server = _serve(exporter, str(tmp_path / "nvidia-smi"))
    try:
        status, _, body = _get(server, "/metrics")
        assert status == 200
        assert value(parse(body)[0], "glm5_gpu_query_error", reason="nvidia_smi_missing") == 1
    finally:
        server.shutdown()
        server.server_close()


def test_once_on_a_host_without_gpus(tmp_path):
    script = Path(__file__).resolve().parents[2] / "roles" / "gpu_exporter" / "files" / "glm5_gpu_exporter.py"
    run = subprocess.run([sys.executable, str(script), "--once", "--nvidia-smi", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert value(parse(run.stdout)[0], "glm5_gpu_up") == 0
    assert "nvidia_smi_missing" in run.stderr


def test_standard_library_only():
    """The exporter runs on the host's python3, outside any venv."""
    script = Path(__file__).resolve().parents[2] / "roles" / "gpu_exporter" / "files" / "glm5_gpu_exporter.py"
    imported = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported - set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
