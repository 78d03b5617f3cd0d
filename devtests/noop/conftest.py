"""Load role glm5's package, tree and no-op shortcut plugins (filters, modules glm5_tree_state and
glm5_host_state, action plugin glm5_run_inputs) as modules."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    return load_file(path, name)


@pytest.fixture(scope="session")
def pkgs() -> ModuleType:
    return _load("glm5_packages", ROOT / "roles/glm5/filter_plugins/glm5_packages.py")


@pytest.fixture(scope="session")
def tree() -> ModuleType:
    return _load("glm5_tree", ROOT / "roles/glm5/filter_plugins/glm5_tree.py")


@pytest.fixture(scope="session")
def tree_state() -> ModuleType:
    return _load("glm5_tree_state", ROOT / "roles/glm5/library/glm5_tree_state.py")


@pytest.fixture(scope="session")
def drv() -> ModuleType:
    return _load("nvidia_driver_filters", ROOT / "roles/nvidia_driver/filter_plugins/nvidia_driver_filters.py")


@pytest.fixture(scope="session")
def hs() -> ModuleType:
    return _load("glm5_host_state", ROOT / "roles/glm5/library/glm5_host_state.py")


@pytest.fixture(scope="session")
def ri() -> ModuleType:
    return _load("glm5_run_inputs", ROOT / "roles/glm5/action_plugins/glm5_run_inputs.py")
