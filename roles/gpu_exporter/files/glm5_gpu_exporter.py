#!/usr/bin/env python3
"""glm5_gpu_exporter: Prometheus metrics of the host's NVIDIA GPUs, read from nvidia-smi.

Each scrape of ``/metrics`` runs::

    nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits

and answers in the Prometheus text format (version 0.0.4): one sample per GPU and
field, labelled ``gpu`` (index), ``uuid`` and ``name``. A field the GPU does not
report (``[N/A]``, ``[Not Supported]``, any other bracketed value) is left out, not
reported as 0. When nvidia-smi is missing, fails, hangs or prints what cannot be
parsed, the exporter keeps serving: ``glm5_gpu_up`` is 0 and
``glm5_gpu_query_error{reason=...}`` says why, so a host without GPUs is reported,
not crashed on. A field the installed driver does not know is dropped once and the
query repeated without it.

Standard library only (Python 3.11+); installed by role gpu_exporter as a single
file and run by its systemd unit. ``--once`` prints one scrape to stdout.
"""

from __future__ import annotations

import argparse
import csv
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = logging.getLogger("glm5_gpu_exporter")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024
MHZ = 1_000_000

# Columns that identify a GPU; the query is useless without them.
IDENTITY = ("index", "uuid", "name")


def _number(value: str) -> float | None:
    """A number, or None for what nvidia-smi prints when it has none ([N/A], [Not Supported], ...)."""
    text = value.strip()
    if not text or text.startswith("[") or text.upper() in {"N/A", "NOT SUPPORTED", "UNKNOWN"}:
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Metric:
    """How one nvidia-smi field becomes one Prometheus sample per GPU."""

    query: str
    name: str
    help: str
    kind: str = "gauge"
    convert: Callable[[str], float | None] = field(default=_number)
    labels: tuple[tuple[str, str], ...] = ()


def _scaled(factor: float) -> Callable[[str], float | None]:
    def convert(value: str) -> float | None:
        number = _number(value)
        return None if number is None else number * factor

    return convert


def _enabled(value: str) -> float | None:
    text = value.strip().lower()
    return {"enabled": 1.0, "disabled": 0.0}.get(text)


def _pstate(value: str) -> float | None:
    match = re.fullmatch(r"P(\d{1,2})", value.strip())
    return float(match.group(1)) if match else None


METRICS: tuple[Metric, ...] = (
    Metric("persistence_mode", "glm5_gpu_persistence_mode", "Persistence mode (1 enabled, 0 disabled).",
           convert=_enabled),
    Metric("pstate", "glm5_gpu_performance_state", "Performance state (0 = P0, maximum performance).",
           convert=_pstate),
    Metric("fan.speed", "glm5_gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum (0-1).",
           convert=_scaled(0.01)),
    Metric("temperature.gpu", "glm5_gpu_temperature_celsius", "GPU core temperature."),
    Metric("temperature.memory", "glm5_gpu_memory_temperature_celsius", "GPU memory temperature."),
    Metric("utilization.gpu", "glm5_gpu_utilization_ratio",
           "Fraction of the last sample period in which a kernel ran (0-1).", convert=_scaled(0.01)),
    Metric("utilization.memory", "glm5_gpu_memory_utilization_ratio",
           "Fraction of the last sample period in which memory was read or written (0-1).",
           convert=_scaled(0.01)),
    Metric("memory.total", "glm5_gpu_memory_total_bytes", "Total GPU memory.", convert=_scaled(MIB)),
    Metric("memory.used", "glm5_gpu_memory_used_bytes", "Used GPU memory.", convert=_scaled(MIB)),
    Metric("power.draw", "glm5_gpu_power_draw_watts", "Power draw."),
    Metric("power.limit", "glm5_gpu_power_limit_watts", "Power management limit."),
    Metric("clocks.sm", "glm5_gpu_sm_clock_hertz", "Current SM clock.", convert=_scaled(MHZ)),
    Metric("clocks.max.sm", "glm5_gpu_sm_clock_max_hertz", "Maximum SM clock.", convert=_scaled(MHZ)),
    Metric("clocks.mem", "glm5_gpu_memory_clock_hertz", "Current memory clock.", convert=_scaled(MHZ)),
    Metric("ecc.mode.current", "glm5_gpu_ecc_mode_enabled", "ECC mode in effect (1 enabled, 0 disabled).",
           convert=_enabled),
    Metric("ecc.errors.corrected.volatile.total", "glm5_gpu_ecc_volatile_errors_total",
           "ECC errors since the driver was loaded.", kind="counter", labels=(("type", "corrected"),)),
    Metric("ecc.errors.uncorrected.volatile.total", "glm5_gpu_ecc_volatile_errors_total",
           "ECC errors since the driver was loaded.", kind="counter", labels=(("type", "uncorrected"),)),
    Metric("ecc.errors.corrected.aggregate.total", "glm5_gpu_ecc_aggregate_errors_total",
           "ECC errors over the GPU's lifetime.", kind="counter", labels=(("type", "corrected"),)),
    Metric("ecc.errors.uncorrected.aggregate.total", "glm5_gpu_ecc_aggregate_errors_total",
           "ECC errors over the GPU's lifetime.", kind="counter", labels=(("type", "uncorrected"),)),
)
# Columns that only label glm5_gpu_info.
INFO = ("pci.bus_id", "driver_version")
DEFAULT_FIELDS: tuple[str, ...] = (*IDENTITY, *INFO, *dict.fromkeys(m.query for m in METRICS))

UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


class QueryError(Exception):
    """nvidia-smi gave no usable answer; ``reason`` is the glm5_gpu_query_error label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Gpu:
    """One row of the query: the GPU's identity and its fields as nvidia-smi printed them."""

    index: str
    uuid: str
    name: str
    values: dict[str, str]


def parse_csv(text: str, fields: Sequence[str]) -> list[Gpu]:
    """The rows of ``--format=csv,noheader,nounits`` output for the query ``fields``."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(fields):
            raise QueryError("parse_error", f"{len(row)} columns, expected {len(fields)}: {','.join(row)[:200]}")
        values = {name: cell.strip() for name, cell in zip(fields, row, strict=True)}
        if not re.fullmatch(r"\d+", values["index"]):
            raise QueryError("parse_error", f"GPU index {values['index']!r} is not a number")
        gpus.append(Gpu(values["index"], values["uuid"], values["name"], values))
    return gpus


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)
    return "{" + inner + "}" if inner else ""


def _format_value(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


@dataclass
class Scrape:
    """The outcome of one query: the GPUs, or why there are none."""

    gpus: list[Gpu]
    error: QueryError | None
    duration_s: float


def render(scrape: Scrape, errors_total: int) -> str:
    """The Prometheus text exposition of one scrape."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {_format_value(value)}" for labels, value in samples)

    family("glm5_gpu_up", "gauge", "1 when the last nvidia-smi query succeeded, else 0.",
           [("", 0.0 if scrape.error else 1.0)])
    if scrape.error is not None:
        family("glm5_gpu_query_error", "gauge", "Why the last nvidia-smi query failed (1 for the reason).",
               [(_labels([("reason", scrape.error.reason)]), 1.0)])
    family("glm5_gpu_scrape_errors_total", "counter", "Failed nvidia-smi queries since the exporter started.",
           [("", float(errors_total))])
    family("glm5_gpu_scrape_duration_seconds", "gauge", "How long the nvidia-smi query took.",
           [("", round(scrape.duration_s, 6))])
    family("glm5_gpu_count", "gauge", "GPUs nvidia-smi reported.", [("", float(len(scrape.gpus)))])
    if not scrape.gpus:
        return "\n".join(out) + "\n"

    def ident(gpu: Gpu) -> list[tuple[str, str]]:
        return [("gpu", gpu.index), ("uuid", gpu.uuid), ("name", gpu.name)]

    family("glm5_gpu_info", "gauge", "Static facts of the GPU (value 1).", [
        (_labels(ident(gpu) + [(k.replace(".", "_"), gpu.values[k]) for k in INFO if k in gpu.values]), 1.0)
        for gpu in scrape.gpus
    ])
    seen: dict[str, list[tuple[str, float]]] = {}
    described: dict[str, Metric] = {}
    for metric in METRICS:
        described.setdefault(metric.name, metric)
        samples = seen.setdefault(metric.name, [])
        for gpu in scrape.gpus:
            raw = gpu.values.get(metric.query)
            value = metric.convert(raw) if raw is not None else None
            if value is not None:
                samples.append((_labels(ident(gpu) + list(metric.labels)), value))
    for name, samples in seen.items():
        if samples:
            family(name, described[name].kind, described[name].help, samples)
    return "\n".join(out) + "\n"


Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


class Collector:
    """Runs the query (one at a time) and remembers the fields the driver rejected."""

    def __init__(self, nvidia_smi: str, timeout: float, runner: Runner = _run,
                 fields: Sequence[str] = DEFAULT_FIELDS) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout
        self.runner = runner
        self.fields = list(fields)
        self.errors_total = 0
        self._lock = threading.Lock()
        self._last_state = ""

    def query(self) -> list[Gpu]:
        while True:
            argv = [self.nvidia_smi, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits"]
            try:
                proc = self.runner(argv, self.timeout)
            except FileNotFoundError as exc:
                raise QueryError("nvidia_smi_missing", f"{self.nvidia_smi}: {exc.strerror}") from exc
            except subprocess.TimeoutExpired as exc:
                raise QueryError("timeout", f"nvidia-smi did not answer in {self.timeout:g} s") from exc
            except OSError as exc:
                raise QueryError("nvidia_smi_failed", f"{self.nvidia_smi}: {exc.strerror}") from exc
            if proc.returncode == 0:
                return parse_csv(proc.stdout, self.fields)
            message = (proc.stdout + proc.stderr).strip()
            unknown = UNKNOWN_FIELD.search(message)
            if unknown and unknown.group(1) in self.fields and unknown.group(1) not in IDENTITY:
                LOG.warning("nvidia-smi does not know field %s; querying without it", unknown.group(1))
                self.fields.remove(unknown.group(1))
                continue
            first = message.splitlines()[0] if message else "(no output)"
            raise QueryError("nvidia_smi_failed", f"exit {proc.returncode}: {first[:300]}")

    def scrape(self) -> Scrape:
        with self._lock:
            start = time.monotonic()
            try:
                gpus, error = self.query(), None
            except QueryError as exc:
                gpus, error = [], exc
                self.errors_total += 1
            result = Scrape(gpus, error, time.monotonic() - start)
            self._log_change(result)
            return result

    def metrics(self) -> str:
        result = self.scrape()
        return render(result, self.errors_total)

    def _log_change(self, result: Scrape) -> None:
        state = f"down: {result.error}" if result.error else f"up: {len(result.gpus)} GPU(s)"
        if state != self._last_state:
            (LOG.error if result.error else LOG.info)("%s", state)
            self._last_state = state


class Handler(BaseHTTPRequestHandler):
    server_version = "glm5_gpu_exporter"
    collector: Collector

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, status, ctype = self.collector.metrics().encode(), 200, CONTENT_TYPE
        elif path == "/":
            body, status, ctype = b'glm5_gpu_exporter: <a href="/metrics">/metrics</a>\n', 200, "text/html"
        else:
            body, status, ctype = b"not found\n", 404, "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """No access log: Prometheus scrapes every few seconds."""


def make_server(address: str, port: int, collector: Collector) -> ThreadingHTTPServer:
    """An HTTP server for ``collector`` on address:port (IPv6 when the address has a colon); not started."""
    handler = type("BoundHandler", (Handler,), {"collector": collector})

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        daemon_threads = True

    return Server((address, port), handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prometheus exporter of nvidia-smi GPU metrics")
    parser.add_argument("--listen-address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9835)
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="path of nvidia-smi")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one query may take")
    parser.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    collector = Collector(args.nvidia_smi, args.timeout)
    if args.once:
        sys.stdout.write(collector.metrics())
        return 0
    server = make_server(args.listen_address, args.port, collector)
    LOG.info("serving http://%s:%d/metrics (nvidia-smi: %s)", args.listen_address, server.server_port,
             args.nvidia_smi)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
