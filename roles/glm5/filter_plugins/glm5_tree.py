"""The controller side of module glm5_tree_state: relative path -> sha256 of a tree's files.

Runs on the controller (filters do), so a no-op run hashes the source tree locally and
asks the host once (glm5_tree_state) instead of once per file (a copy per file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_manifest(root: Any, files: Iterable[Any] | None = None) -> dict[str, str]:
    """sha256 of each file under `root`: the named `files` (relative paths), or every
    regular file below it (links followed, as copy's local_follow does)."""
    base = Path(str(root)).resolve()
    if not base.is_dir():
        raise ValueError(f"tree_manifest: {root} is not a directory on the controller")
    if files is not None:
        rels = [PurePosixPath(str(f)) for f in files]
    else:
        rels = [PurePosixPath(p.relative_to(base).as_posix()) for p in base.rglob("*") if p.is_file()]
    manifest: dict[str, str] = {}
    for rel in sorted(rels):
        path = base / rel
        if rel.is_absolute() or ".." in rel.parts or not path.is_file():
            raise ValueError(f"tree_manifest: {str(rel)!r} is not a file inside {root}")
        manifest[rel.as_posix()] = _sha256(path)
    return manifest


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"tree_manifest": tree_manifest}
