"""The stand-in's completions and in-flight gauge (what a router and a drain use), and
the bounded load client of molecule/fleet: it counts every request, and a failure
(a wrong key, a dead endpoint) makes it report failed > 0 and exit 1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "src" / "glm5_tools" / "probe" / "standin.py"
LOAD = ROOT / "src" / "glm5_tools" / "probe" / "load.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standin(tmp_path):
    env = {**os.environ, "VLLM_API_KEY": "sekret", "VLLM_PROBE_STANDIN_LATENCY_MS": "300",
           "STATE_DIRECTORY": str(tmp_path), "RUNTIME_DIRECTORY": str(tmp_path)}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / "cache" / var.lower())
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", "--served-model-name", "glm-5",
         "--host", "127.0.0.1", "--port", str(port), "--threads", "8"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(10)


def _running(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def _load(url: str, key: str, n: int) -> tuple[int, dict[str, object]]:
    run = subprocess.run(
        [sys.executable, str(LOAD), "--url", url, "--model", "glm-5", "--concurrency", "4",
         "--min-requests", str(n), "--max-requests", str(n), "--max-seconds", "60", "--timeout", "5"],
        env={**os.environ, "VLLM_API_KEY": key}, capture_output=True, text=True, check=False,
    )
    return run.returncode, json.loads(run.stdout)


def test_gauge_counts_requests_in_flight(standin):
    assert _running(standin) == 0
    body = json.dumps({"model": "glm-5", "prompt": "x"}).encode()
    req = urllib.request.Request(standin + "/v1/completions", data=body, method="POST",
                                 headers={"Authorization": "Bearer sekret",
                                          "Content-Type": "application/json"})
    answers: list[dict[str, object]] = []
    thread = threading.Thread(target=lambda: answers.append(json.loads(urllib.request.urlopen(req).read())))
    thread.start()
    time.sleep(0.15)
    assert _running(standin) == 1
    thread.join()
    assert _running(standin) == 0
    assert answers[0]["choices"] and answers[0]["model"] == "glm-5"


def test_load_counts_zero_failures(standin):
    rc, report = _load(standin, "sekret", 12)
    assert (rc, report["requests"], report["ok"], report["failed"]) == (0, 12, 12, 0)


def test_load_reports_a_wrong_key(standin):
    rc, report = _load(standin, "wrong", 8)
    assert rc == 1
    assert report["failed"] == 8 and report["failures"] == {"HTTP 401": 8}


def test_load_reports_a_dead_endpoint():
    rc, report = _load(f"http://127.0.0.1:{_free_port()}", "k", 4)
    assert rc == 1 and report["failed"] == 4
