#!/usr/bin/python
"""Ansible module: verify files under a root against a manifest of sizes and sha256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_model_verify
short_description: Verify model files against a manifest (sizes and sha256)
description:
  - The manifest is either sha256sum lines (C(<sha256>  <path>)) or a JSON list of
    objects with C(path), C(size) and C(sha256) (null = size only), paths relative to I(root).
  - Hashing 400 GB takes long, so verified files are recorded in I(stamp) with their
    size and mtime; unchanged files are not hashed again. Only writing the stamp is a change.
options:
  root: {description: Directory the manifest paths are relative to., type: path, required: true}
  manifest: {description: Manifest file., type: path, required: true}
  stamp: {description: File recording what was verified., type: path, required: true}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_model_verify:
    root: /srv/models/glm-5
    manifest: /srv/models/glm-5/SHA256SUMS
    stamp: /srv/models/glm-5/.glm5-verified.json
"""

RETURN = r"""
files: {description: Number of files verified., type: int, returned: always}
bytes: {description: Their total size., type: int, returned: always}
hashed: {description: Files hashed this run (not found unchanged in the stamp)., type: list, returned: always}
"""


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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify(
    root: Path, entries: list[dict[str, Any]], stamp: dict[str, Any]
) -> tuple[list[str], dict[str, Any], list[str], int]:
    """Return (errors, new stamp, hashed paths, total bytes)."""
    errors: list[str] = []
    new_stamp: dict[str, Any] = {}
    hashed: list[str] = []
    total = 0
    for entry in entries:
        rel = entry["path"]
        if rel.startswith("/") or ".." in Path(rel).parts:
            errors.append(f"{rel}: path leaves the model directory")
            continue
        path = root / rel
        try:
            st = path.stat()
        except OSError:
            errors.append(f"{rel}: missing")
            continue
        total += st.st_size
        if entry.get("size") is not None and st.st_size != int(entry["size"]):
            errors.append(f"{rel}: size {st.st_size}, manifest says {entry['size']}")
            continue
        want = entry.get("sha256")
        key = [st.st_size, st.st_mtime_ns, want]
        if stamp.get(rel) == key:
            new_stamp[rel] = key
            continue
        if want:
            got = sha256_file(path)
            hashed.append(rel)
            if got != want:
                errors.append(f"{rel}: sha256 {got}, manifest says {want}")
                continue
        new_stamp[rel] = key
    return errors, new_stamp, hashed, total


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "manifest": {"type": "path", "required": True},
            "stamp": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    root = Path(module.params["root"])
    manifest = Path(module.params["manifest"])
    stamp_path = Path(module.params["stamp"])
    try:
        entries = parse_manifest(manifest.read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg=f"cannot read the manifest {manifest}: {exc}")
    if not entries:
        module.fail_json(msg=f"the manifest {manifest} lists no files")
    try:
        old = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        old = {}
    errors, new, hashed, total = verify(root, entries, old if isinstance(old, dict) else {})
    if errors:
        module.fail_json(msg="model files do not match the manifest: " + "; ".join(errors[:20]))
    changed = new != old
    if changed and not module.check_mode:
        tmp = stamp_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
        tmp.chmod(0o640)
        tmp.replace(stamp_path)
    module.exit_json(changed=changed, files=len(entries), bytes=total, hashed=hashed)


if __name__ == "__main__":
    main()
