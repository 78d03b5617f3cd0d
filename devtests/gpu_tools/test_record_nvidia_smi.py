"""tools/gpu/record-nvidia-smi, the recorder of what role gpu_exporter needs from a real
nvidia-smi: run here against fake_nvidia_smi (molecule's TEST DOUBLE of nvidia-smi, which
replays the H200's recording), so that the script's wiring is checked before a GPU call
spends device time on it: the query, the refused field, the unprivileged runs, the
exporter's scrape and its HTTP server as the unit's user would run it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "molecule" / "fixtures" / "fake_nvidia_smi"
RECORDING = FAKE / "recorded" / "h200-driver-580.159.04"


@pytest.fixture
def fake_bin() -> Iterator[Path]:
    # world-readable: the recorder runs nvidia-smi and the exporter as uid 65534 too
    d = Path(tempfile.mkdtemp(prefix="glm5-fake-smi-"))
    try:
        d.chmod(0o755)
        shutil.copy(FAKE / "fake_nvidia_smi.py", d / "nvidia-smi")
        (d / "nvidia-smi").chmod(0o755)
        shutil.copytree(RECORDING, d / "recording")
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_records_against_the_double(fake_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    copies_before = set(Path("/tmp").glob("glm5_gpu_exporter.*.py"))
    env = dict(
        os.environ, PATH=f"{fake_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}", RECORD_PORT=str(_free_port())
    )
    proc = subprocess.run(
        [str(ROOT / "tools" / "gpu" / "record-nvidia-smi"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fields = (out / "fields.txt").read_text().strip().split(",")
    row = (out / "query.csv").read_text().strip().split(", ")
    assert len(fields) == len(row) > 20 and row[0] == "0"
    assert (out / "unprivileged.csv").read_text().splitlines()[0] == (out / "query.csv").read_text().strip()
    assert "is not a valid field to query" in (out / "unknown-field.out").read_text()
    assert "glm5_gpu_up 1" in (out / "once.txt").read_text()
    # the HTTP server, as uid 65534 with no_new_privs, scraped
    assert "glm5_gpu_up 1" in (out / "server-metrics.txt").read_text()
    assert set(Path("/tmp").glob("glm5_gpu_exporter.*.py")) == copies_before  # its copy removed
