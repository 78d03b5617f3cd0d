"""vllm_probe_standin (the test double of `vllm serve`): its start checks pass in a
plain environment, and it serves /health and /v1/models with API-key auth."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from glm5_tools.probe import ApiClient, ApiError

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "src" / "glm5_tools" / "probe" / "standin.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_standin_serves_with_key(tmp_path):
    gguf = tmp_path / "m-00001-of-00002.gguf"
    gguf.write_bytes(b"GGUF")
    env = {**os.environ, "VLLM_API_KEY": "sekret", "STATE_DIRECTORY": str(tmp_path),
           "RUNTIME_DIRECTORY": str(tmp_path)}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / "cache" / var.lower())
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", str(gguf), "--served-model-name", "glm-5",
         "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "TRITON_MLA",
         "--threads", "16"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        client = ApiClient(f"http://127.0.0.1:{port}", "sekret", timeout=5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if client.status("/health") == 200:
                    break
            except ApiError:
                time.sleep(0.5)
        assert client.model_ids() == ["glm-5"]
        assert ApiClient(f"http://127.0.0.1:{port}").status("/v1/models") == 401
        report = json.loads((tmp_path / "vllm_probe_standin-report.json").read_text())
        assert report["failed"] == []
        assert set(report["checks"]) >= {"caches", "shm", "proc", "wx_memory", "threads", "process", "sockets"}
    finally:
        proc.terminate()
        proc.wait(10)
