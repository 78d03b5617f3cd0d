"""Load the filter plugins of roles nvidia_driver and cuda_toolkit as modules."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    return load_file(path, name)


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
