"""Filters of the preflight role."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any


def mount_for(path: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the entry of ansible_facts.mounts whose file system holds ``path``.

    ``path`` need not exist yet: the deepest mount point that is ``path`` or one
    of its parents wins. Raises ValueError when no mount covers it (not even /).
    """
    target = PurePosixPath(path)
    best: dict[str, Any] | None = None
    for mount in mounts:
        point = PurePosixPath(mount["mount"])
        if (target == point or point in target.parents) and (
            best is None or len(point.parts) > len(PurePosixPath(best["mount"]).parts)
        ):
            best = mount
    if best is None:
        raise ValueError(f"no mounted file system holds {path}")
    return best


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"preflight_mount_for": mount_for}
