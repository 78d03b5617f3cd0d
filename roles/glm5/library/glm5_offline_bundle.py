#!/usr/bin/python
"""Ansible module: write or verify the manifest of an offline bundle.

An offline bundle is a directory (wheels/, debs/, model/) with a manifest,
bundle-manifest.json, naming every file with its size and sha256 plus the versions
the bundle was built for. The sha256 of the manifest itself is the trust anchor:
the operator copies it from the build output into the inventory
(glm5_offline_bundle_sha256); verify refuses a bundle whose manifest differs, then
every file that differs from the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_offline_bundle
short_description: Write (state=built) or verify (state=verified) an offline bundle's manifest
description:
  - C(built) hashes every file below I(path) (except the manifest) and writes
    C(bundle-manifest.json) with I(versions); it changes only when the content differs.
  - C(verified) checks the manifest's sha256 against I(manifest_sha256), then the files
    below the prefixes I(hash_prefixes) (size and sha256) and I(size_prefixes) (size only),
    and that each of I(require) is the prefix of at least one file. Never changes anything.
options:
  path: {description: The bundle directory., type: path, required: true}
  state: {description: built or verified., type: str, choices: [built, verified], default: verified}
  versions: {description: Versions recorded in the manifest (built)., type: dict, default: {}}
  manifest_sha256: {description: Expected sha256 of the manifest (verified)., type: str, default: ""}
  hash_prefixes:
    {description: Prefixes of the files to hash (verified; "" = all)., type: list, elements: str, default: [""]}
  size_prefixes:
    {description: Prefixes of the files whose size only is checked (verified)., type: list, elements: str, default: []}
  require:
    {description: Prefixes that must name at least one file (verified)., type: list, elements: str, default: []}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_offline_bundle:
    path: /srv/glm5-bundle
    state: verified
    manifest_sha256: "{{ glm5_offline_bundle_sha256 }}"
    hash_prefixes: [debs/]
    require: [debs/Packages]
"""

RETURN = r"""
manifest_sha256: {description: sha256 of the manifest., type: str, returned: always}
versions: {description: The versions the manifest records., type: dict, returned: always}
files: {description: Number of files in the manifest., type: int, returned: always}
bytes: {description: Their total size., type: int, returned: always}
checked: {description: Files checked this run (verified)., type: int, returned: always}
"""

MANIFEST = "bundle-manifest.json"
FORMAT = 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def scan(root: Path) -> dict[str, dict[str, Any]]:
    """Every regular file below root (the manifest excluded): relative path -> size, sha256.

    Symlinks are refused rather than followed or silently left out."""
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            if full.is_symlink() or not full.is_file():
                raise ValueError(f"{rel}: not a regular file (links are not bundled)")
            files[rel] = {"size": full.stat().st_size, "sha256": sha256_file(full)}
    return files


def render(files: dict[str, dict[str, Any]], versions: dict[str, Any]) -> str:
    """The manifest text: sorted, no timestamps, so a rebuild of the same content is byte-identical."""
    doc = {"format": FORMAT, "versions": versions, "files": files}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def problems(
    root: Path,
    manifest: dict[str, Any],
    hash_prefixes: list[str],
    size_prefixes: list[str],
    require: list[str],
) -> tuple[list[str], int]:
    """What is wrong with the files under root against the manifest, and how many were checked."""
    found: list[str] = []
    checked = 0
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    for rel in sorted(files):
        if rel.startswith("/") or ".." in Path(rel).parts:
            found.append(f"{rel}: path leaves the bundle")
            continue
        do_hash = any(rel.startswith(p) for p in hash_prefixes)
        do_size = do_hash or any(rel.startswith(p) for p in size_prefixes)
        if not do_size:
            continue
        checked += 1
        full = root / rel
        if not full.is_file():
            found.append(f"{rel}: missing")
            continue
        size = full.stat().st_size
        if size != files[rel]["size"]:
            found.append(f"{rel}: size {size}, manifest says {files[rel]['size']}")
            continue
        if do_hash and sha256_file(full) != files[rel]["sha256"]:
            found.append(f"{rel}: sha256 differs from the manifest")
    for prefix in require:
        if not any(rel.startswith(prefix) for rel in files):
            found.append(f"{prefix}: not in the bundle (the manifest names no such file)")
    return found, checked


def run(params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    root = Path(params["path"])
    manifest_path = root / MANIFEST
    if params["state"] == "built":
        if not root.is_dir():
            raise ValueError(f"bundle directory {root} does not exist")
        files = scan(root)
        text = render(files, params["versions"])
        old = manifest_path.read_text() if manifest_path.is_file() else None
        changed = old != text
        if changed and not check_mode:
            manifest_path.write_text(text)
        return {
            "changed": changed,
            "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "versions": params["versions"],
            "files": len(files),
            "bytes": sum(f["size"] for f in files.values()),
            "checked": len(files),
        }
    if not root.is_dir():
        raise ValueError(f"offline bundle directory {root} does not exist on this host")
    if not manifest_path.is_file():
        raise ValueError(
            f"{manifest_path} is missing: not an offline bundle (build it with playbooks/offline_bundle.yml)"
        )
    raw = manifest_path.read_bytes()
    actual = hashlib.sha256(raw).hexdigest()
    expected = params["manifest_sha256"].strip().lower()
    if actual != expected:
        raise ValueError(
            f"{manifest_path} has sha256 {actual}, but glm5_offline_bundle_sha256 is "
            f"'{expected}': the bundle is not the one the inventory trusts (copy the sha256 "
            "the bundle build printed, or rebuild and copy the bundle again)"
        )
    manifest = json.loads(raw)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path}: unknown manifest format {manifest.get('format')!r}")
    found, checked = problems(root, manifest, params["hash_prefixes"], params["size_prefixes"], params["require"])
    if found:
        raise ValueError(f"offline bundle {root} does not match its manifest: " + "; ".join(found))
    files = manifest.get("files", {})
    return {
        "changed": False,
        "manifest_sha256": actual,
        "versions": manifest.get("versions", {}),
        "files": len(files),
        "bytes": sum(int(f["size"]) for f in files.values()),
        "checked": checked,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["built", "verified"], "default": "verified"},
            "versions": {"type": "dict", "default": {}},
            "manifest_sha256": {"type": "str", "default": ""},
            "hash_prefixes": {"type": "list", "elements": "str", "default": [""]},
            "size_prefixes": {"type": "list", "elements": "str", "default": []},
            "require": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except (ValueError, OSError, json.JSONDecodeError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
