"""Filters of role ml_env: reading the lock (a `uv pip compile --generate-hashes` output)
and choosing which versioned venvs to keep."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def normalize_name(name: str) -> str:
    """PEP 503 normalised project name (lower case, runs of -_. as one -)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def ml_env_lock_pins(text: str) -> dict[str, str]:
    """Map each pinned project in a lock (normalised name) to its exact version.

    Raises ValueError when a requirement line is not an exact `==` pin, since a
    lock that is not exact cannot be verified against the installed venv.
    """
    if not isinstance(text, str):
        raise TypeError(f"ml_env_lock_pins expects the lock's text, got {type(text).__name__}")
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith("--"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"lock line is not an exact '==' pin: {line!r}")
        pins[normalize_name(match.group(1))] = match.group(3)
    if not pins:
        raise ValueError("the lock pins no packages")
    return pins


def ml_env_venv_name(sha256: str, length: int = 12) -> str:
    """Directory name of the versioned venv for a lock digest."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256 or ""):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"ml-env-{sha256[:length]}"


def ml_env_pin_problems(pins: Mapping[str, str], required: Mapping[str, Any]) -> list[str]:
    """What a lock's pins lack against ``required`` (name -> exact version, "" = any).

    Names are compared PEP 503-normalised. An empty list means the lock is acceptable.
    """
    if not isinstance(required, Mapping):
        raise TypeError(f"ml_env_required_pins must be a mapping, got {type(required).__name__}")
    problems = []
    for name, want in required.items():
        have = pins.get(normalize_name(str(name)))
        if have is None:
            problems.append(f"{name} is not pinned")
        elif want not in (None, "") and have != str(want):
            problems.append(f"{name} is pinned to {have}, {want} is required")
    return problems


def ml_env_venvs_to_prune(
    venvs: Sequence[str],
    markers: Sequence[Mapping[str, Any]],
    current: str,
    previous: str,
    keep: int,
) -> list[str]:
    """The versioned venv directories to remove, oldest first.

    ``venvs``: the ml-env-* directories; ``markers``: the completion markers found in
    them (``find`` results with ``path`` and ``mtime``). Kept, up to ``keep`` in all:
    the venv of the lock in use, then ``previous`` (the venv the stable link pointed
    at before it was last moved, i.e. the one to roll back to), then the complete
    venvs newest first. A venv without marker (a build that stopped half-way) is
    never kept, unless it is the current one (being rebuilt).
    """
    if int(keep) < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    complete_mtime = {
        posixpath.dirname(str(m["path"])): float(m["mtime"])
        for m in markers
        if posixpath.dirname(str(m["path"])) in venvs
    }
    order = [current]
    if previous in complete_mtime:
        order.append(previous)
    order += sorted(complete_mtime, key=lambda path: complete_mtime[path], reverse=True)
    kept: list[str] = []
    for path in order:
        if path not in kept and len(kept) < int(keep):
            kept.append(path)
    doomed = [path for path in venvs if path not in kept]
    return sorted(doomed, key=lambda path: complete_mtime.get(path, 0.0))


class FilterModule:
    """ml_env filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ml_env_lock_pins": ml_env_lock_pins,
            "ml_env_venv_name": ml_env_venv_name,
            "ml_env_pin_problems": ml_env_pin_problems,
            "ml_env_venvs_to_prune": ml_env_venvs_to_prune,
        }
