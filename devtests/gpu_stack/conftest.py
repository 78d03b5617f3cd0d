"""Load the filter plugins of roles nvidia_driver and cuda_toolkit as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def drv() -> ModuleType:
    return _load(
        "nvidia_driver_filters",
        ROOT / "roles/nvidia_driver/filter_plugins/nvidia_driver_filters.py",
    )


@pytest.fixture(scope="session")
def cuda() -> ModuleType:
    return _load(
        "cuda_toolkit_filters",
        ROOT / "roles/cuda_toolkit/filter_plugins/cuda_toolkit_filters.py",
    )
