"""Import a Python file that is not a package on sys.path: an Ansible filter plugin or
module (roles/*/filter_plugins, roles/*/library), a script the roles ship to hosts
(roles/*/files), a test double (molecule/fixtures) or a post-deploy check (tests/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_file(path: Path | str, name: str | None = None) -> ModuleType:
    """The module of ``path`` (relative to the repository root or absolute), imported
    under ``name`` (default: the file's stem) and registered in sys.modules, so that
    dataclasses and pickling inside it find their module."""
    path = Path(path)
    if not path.is_absolute():
        path = ROOT / path
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_role_module(path: Path | str) -> ModuleType:
    """A module of a role's library/ (relative to the repository root or absolute), with
    the roles' module_utils importable as Ansible ships them (ansible.module_utils.*)."""
    for util in sorted((ROOT / "roles").glob("*/module_utils/*.py")):
        name = f"ansible.module_utils.{util.stem}"
        if name not in sys.modules:
            load_file(util, name)
    return load_file(path)
