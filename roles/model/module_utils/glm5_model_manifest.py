"""The manifests of role model's files: sha256sum lines (``<sha256>  <path>``) or a JSON
list of {path, size, sha256} (sha256 null = size only), paths relative to a root. Read by
modules glm5_model_verify and glm5_model_copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_manifest(text: str) -> list[dict[str, Any]]:
    """Entries {path, size, sha256} from sha256sum lines or a JSON list."""
    stripped = text.strip()
    if stripped.startswith("["):
        entries = json.loads(stripped)
        return [
            {"path": str(e["path"]), "size": e.get("size"), "sha256": e.get("sha256")}
            for e in entries
        ]
    out = []
    for line in stripped.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        digest, _, name = line.partition(" ")
        out.append({"path": name.strip().lstrip("*"), "size": None, "sha256": digest.lower()})
    return out


def leaves_root(rel: str) -> bool:
    """Whether a manifest path is absolute or climbs out of its root."""
    return rel.startswith("/") or ".." in Path(rel).parts
