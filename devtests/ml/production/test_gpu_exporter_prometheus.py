"""The GPU exporter's output read by prometheus_client's own parser (prometheus_client
comes with vLLM's dependencies in the ml-env lock): the recorded H200 answer through
fake_nvidia_smi, and the answer of a host without nvidia-smi."""

import subprocess
import sys
from pathlib import Path

import pytest

parser = pytest.importorskip("prometheus_client.parser")

ROOT = Path(__file__).resolve().parents[3]
EXPORTER = ROOT / "roles" / "gpu_exporter" / "files" / "glm5_gpu_exporter.py"
FAKE_SMI = ROOT / "molecule" / "fixtures" / "fake_nvidia_smi" / "fake_nvidia_smi.py"


def _once(nvidia_smi):
    run = subprocess.run([sys.executable, str(EXPORTER), "--once", "--nvidia-smi", str(nvidia_smi)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return {f.name: f for f in parser.text_string_to_metric_families(run.stdout)}


def test_recorded_answer_parses():
    families = _once(FAKE_SMI)
    assert families["glm5_gpu_up"].samples[0].value == 1
    memory = families["glm5_gpu_memory_total_bytes"]
    assert memory.type == "gauge"
    (sample,) = memory.samples
    assert sample.labels == {"gpu": "0", "uuid": "GPU-f69e2fbe-440d-94e0-6691-0452f7fd5554", "name": "NVIDIA H200"}
    assert sample.value == 143771 * 2**20
    # prometheus_client names counter families without their _total suffix.
    ecc = families["glm5_gpu_ecc_volatile_errors"]
    assert ecc.type == "counter"
    assert {s.labels["type"] for s in ecc.samples} == {"corrected", "uncorrected"}
    assert "glm5_gpu_fan_speed_ratio" not in families  # [N/A] on the H200


def test_no_gpu_answer_parses(tmp_path):
    families = _once(tmp_path / "nvidia-smi")
    assert families["glm5_gpu_up"].samples[0].value == 0
    assert families["glm5_gpu_query_error"].samples[0].labels == {"reason": "nvidia_smi_missing"}

