"""Filters that read the ml-env lock file (a `uv pip compile --generate-hashes` output)."""

from __future__ import annotations

import re
from collections.abc import Callable
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


class FilterModule:
    """ml_env filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"ml_env_lock_pins": ml_env_lock_pins, "ml_env_venv_name": ml_env_venv_name}
