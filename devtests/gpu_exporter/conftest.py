"""Loads role gpu_exporter's exporter (a single file shipped to hosts) and fake_nvidia_smi
(molecule's test double of nvidia-smi) as modules, and the nvidia-smi output recorded on
the GPU validation machine."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "roles" / "gpu_exporter" / "files" / "glm5_gpu_exporter.py"
FAKE_SMI = ROOT / "molecule" / "fixtures" / "fake_nvidia_smi" / "fake_nvidia_smi.py"
# The post-deploy suite's reader of the Prometheus text format (tests/prom_text.py).
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
RECORDING = ROOT / "molecule" / "fixtures" / "fake_nvidia_smi" / "recorded" / "h200-driver-580.159.04"


def load(name: str, path: Path) -> ModuleType:
    return load_file(path, name)


@pytest.fixture(scope="session")
def exporter() -> ModuleType:
    return load("glm5_gpu_exporter", EXPORTER)


@pytest.fixture(scope="session")
def fake_smi() -> ModuleType:
    return load("fake_nvidia_smi", FAKE_SMI)
