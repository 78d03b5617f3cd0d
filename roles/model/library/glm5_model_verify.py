#!/usr/bin/python
"""Ansible module: verify model files against their manifests (sizes and sha256), with a
stat cache of verified hashes and a progress file.

Hashing the ~400 GB of GLM-5's shards takes minutes, so a file is hashed again only when
something about it may have changed. The stat cache records, for each file whose sha256
was computed and found EQUAL to its manifest's, the file's size, mtime, ctime, inode and
device (all in ns where the kernel keeps ns). A later run trusts that record only when
all five are unchanged and the manifest still names the same sha256: any write to the
file changes its ctime, which no user can set back (utime sets mtime and atime, never
ctime), and a file replaced by another has another inode. So a byte flipped with the size
and mtime put back is hashed again and refused. The cache is written only here, only
after a successful comparison, atomically, mode 0600; it is never the source of a
digest: the manifests are (and this module never writes them).

While it hashes it writes a progress file (JSON, key ``line`` a sentence for the
operator) every I(interval) seconds, which role glm5's follow.yml prints while the
module runs in the background (async).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_model_manifest import leaves_root, parse_manifest
from ansible.module_utils.glm5_progress import count, describe, human_bytes, human_seconds, write_atomic

DOCUMENTATION = r"""
module: glm5_model_verify
short_description: Verify model files against manifests (sizes and sha256), stat cache, progress file
description:
  - Each manifest is either sha256sum lines (C(<sha256>  <path>)) or a JSON list of
    objects with C(path), C(size) and C(sha256) (null = size only), paths relative to its C(root).
  - A file is hashed unless the stat cache I(cache) records for it the same size, mtime,
    ctime, inode and device and the manifest's sha256 (written only after that sha256 was
    computed and matched). Only writing the cache or removing a file is a change.
  - I(only_cached=true) hashes nothing: it checks sizes and the cache and returns in
    C(to_hash) what would be hashed (a quick first look, so that a run with nothing to
    hash needs no background job).
options:
  manifests:
    description:
      - The manifests, each a mapping C(path) (the manifest file) and C(root) (the
        directory its paths are relative to).
    type: list
    elements: dict
    required: true
  cache: {description: The stat cache (JSON; root only)., type: path, required: true}
  progress: {description: Progress file written while hashing ("" = none)., type: path, default: ""}
  interval: {description: Seconds between writes of the progress file., type: float, default: 5}
  on_mismatch:
    description:
      - fail (refuse, naming each file) or remove (delete a file whose size or sha256
        differs from its manifest, so that a fetch gets it again; reported in C(removed)).
    type: str
    choices: [fail, remove]
    default: fail
  hint: {description: Sentence appended to a refusal (how to repair)., type: str, default: ""}
  only_cached: {description: Hash nothing (see above)., type: bool, default: false}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_model_verify:
    manifests:
      - {path: /srv/models/glm-5/gguf/.glm5-manifest.json, root: /srv/models/glm-5/gguf}
    cache: /var/lib/glm5/model/verified.json
    progress: /var/lib/glm5/model/verify-progress.json
"""

RETURN = r"""
files: {description: Number of files verified., type: int, returned: always}
bytes: {description: Their total size., type: int, returned: always}
hashed: {description: Files hashed this run (paths relative to their root)., type: list, returned: always}
cached: {description: Files found unchanged in the stat cache (not hashed)., type: int, returned: always}
to_hash: {description: With only_cached, the files that would be hashed., type: list, returned: always}
removed: {description: With on_mismatch=remove, the files removed., type: list, returned: always}
line: {description: One sentence that says what was done., type: str, returned: always}
progress: {description: The last progress line (when files were hashed)., type: str, returned: when files were hashed}
"""

CHUNK = 16 << 20
CACHE_FORMAT = 1
STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def stat_key(st: os.stat_result) -> dict[str, int]:
    """What the cache keys a verified hash on."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


class Progress:
    """The progress document of role glm5's module_utils/glm5_progress.py, written at most
    every ``interval`` seconds."""

    def __init__(self, path: str, interval: float, files: int, to_hash: int, cached: int) -> None:
        self.path = path
        self.interval = max(0.2, interval)
        self.started = time.time()
        self.last = 0.0
        self.doc: dict[str, Any] = {"what": "sha256", "files_total": files, "files_done": 0,
                                    "bytes_total": to_hash, "bytes_done": 0, "cached": cached,
                                    "current": [], "done": False, "pid": os.getpid()}

    def add(self, n: int) -> None:
        self.doc["bytes_done"] += n
        for current in self.doc["current"][:1]:
            current["bytes"] += n
        self.write()

    def write(self, force: bool = False) -> None:
        now = time.time()
        if not self.path or (not force and now - self.last < self.interval):
            return
        self.last = now
        elapsed = now - self.started
        self.doc.update(elapsed=elapsed, updated=now, rate=self.doc["bytes_done"] / elapsed if elapsed > 0 else 0.0)
        write_atomic(self.path, self.doc)


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress.add(len(chunk))
    return digest.hexdigest()


def load_cache(path: Path) -> dict[str, dict[str, Any]]:
    """The cache's entries by absolute path; {} when absent, unreadable or of another format."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or not isinstance(doc.get("files"), dict):
        return {}
    return {k: v for k, v in doc["files"].items() if isinstance(v, dict)}


def save_cache(path: Path, files: dict[str, dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"format": CACHE_FORMAT, "files": files}, indent=1, sort_keys=True) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)


Item = tuple[Path, str, dict[str, Any]]
ToHash = tuple[Path, str, dict[str, Any], dict[str, int]]


def plan(
    items: list[Item], cache: dict[str, dict[str, Any]], on_mismatch: str
) -> tuple[list[str], list[ToHash], dict[str, dict[str, Any]], list[str], int]:
    """Sizes and the cache: (errors, files to hash, entries kept from the cache,
    files of the wrong size, total bytes). ``items``: (root, relative path, manifest entry)."""
    errors: list[str] = []
    wrong_size: list[str] = []
    to_hash: list[ToHash] = []
    kept: dict[str, dict[str, Any]] = {}
    total = 0
    for root, rel, entry in items:
        if leaves_root(rel):
            errors.append(f"{rel}: path leaves the model directory")
            continue
        path = root / rel
        try:
            st = path.stat()
        except OSError:
            errors.append(f"{path}: missing")
            continue
        total += st.st_size
        if entry.get("size") is not None and st.st_size != int(entry["size"]):
            if on_mismatch == "remove":
                wrong_size.append(str(path))
            else:
                errors.append(f"{path}: size {st.st_size}, the manifest says {entry['size']}")
            continue
        want = entry.get("sha256")
        if not want:
            continue
        key = stat_key(st)
        cached = cache.get(str(path))
        if cached is not None and cached.get("sha256") == want and all(cached.get(k) == key[k] for k in STAT_KEYS):
            kept[str(path)] = cached
            continue
        to_hash.append((path, rel, entry, key))
    return errors, to_hash, kept, wrong_size, total


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "manifests": {"type": "list", "elements": "dict", "required": True},
            "cache": {"type": "path", "required": True},
            "progress": {"type": "path", "default": ""},
            "interval": {"type": "float", "default": 5},
            "on_mismatch": {"type": "str", "choices": ["fail", "remove"], "default": "fail"},
            "hint": {"type": "str", "default": ""},
            "only_cached": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    items: list[Item] = []
    for m in p["manifests"]:
        manifest, root = Path(str(m.get("path", ""))), Path(str(m.get("root", "")))
        try:
            entries = parse_manifest(manifest.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            module.fail_json(msg=f"cannot read the manifest {manifest}: {exc}")
        if not entries:
            module.fail_json(msg=f"the manifest {manifest} lists no files")
        items += [(root, e["path"], e) for e in entries]
    cache_path = Path(p["cache"])
    old = load_cache(cache_path)
    on_mismatch = p["on_mismatch"]
    errors, to_hash, kept, wrong_size, total = plan(items, old, on_mismatch)
    hint = f". {p['hint']}" if p["hint"] else ""
    if errors:
        module.fail_json(msg="model files do not match the manifest: " + "; ".join(errors[:20]) + hint)
    result: dict[str, Any] = {"files": len(items), "bytes": total, "cached": len(kept), "hashed": [],
                              "removed": [], "to_hash": [str(t[0]) for t in to_hash]}
    if p["only_cached"]:
        to_hash_bytes = sum(t[3]["size"] for t in to_hash)
        result["to_hash"] += wrong_size
        result["line"] = (
            f"all {count(len(items), 'file')} ({human_bytes(total)}) unchanged since their last verified hash:"
            " not hashed again" if not result["to_hash"] else
            f"{count(len(result['to_hash']), 'file')} of {len(items)} to verify ({human_bytes(to_hash_bytes)} to hash)")
        module.exit_json(changed=False, **result)
    progress = Progress(p["progress"], p["interval"], len(to_hash), sum(t[3]["size"] for t in to_hash), len(kept))
    progress.write(force=True)
    new = dict(kept)
    mismatched: list[str] = []
    for path, _rel, entry, key in to_hash:
        progress.doc["current"] = [{"path": str(path), "bytes": 0, "size": key["size"]}]
        before = progress.doc["bytes_done"]
        got = sha256_file(path, progress)
        after = stat_key(path.stat())
        if after != key:
            errors.append(f"{path}: changed while it was hashed (another process writes it?); run again")
            continue
        progress.doc["files_done"] += 1
        progress.doc["bytes_done"] = before + key["size"]
        result["hashed"].append(str(path))
        if got != entry["sha256"]:
            mismatched.append(str(path))
            if on_mismatch == "fail":
                errors.append(f"{path}: sha256 {got}, the manifest says {entry['sha256']}")
            continue
        new[str(path)] = {**key, "sha256": entry["sha256"]}
        # Kept as it goes: a run killed half way through does not hash the verified files again.
        if not module.check_mode:
            save_cache(cache_path, {**old, **new})
    progress.doc.update(current=[], done=True)
    progress.write(force=True)
    if errors:
        if not module.check_mode and new != old:
            save_cache(cache_path, new)
        module.fail_json(msg="model files do not match the manifest: " + "; ".join(errors[:20]) + hint, **result)
    removed = wrong_size + mismatched
    if removed and not module.check_mode:
        for name in removed:
            Path(name).unlink(missing_ok=True)
    result["removed"] = removed
    changed = new != old or bool(removed)
    if changed and not module.check_mode:
        save_cache(cache_path, new)
    elapsed = time.time() - progress.started
    hashed_bytes = progress.doc["bytes_done"]
    line = (f"sha256 of {count(len(result['hashed']), 'file')} ({human_bytes(hashed_bytes)}) computed in"
            f" {human_seconds(elapsed)} ({human_bytes(hashed_bytes / elapsed if elapsed > 0 else 0)}/s)")
    if kept:
        line += f"; {count(len(kept), 'more file')} unchanged since the last verified hash, not hashed again"
    if removed:
        line += (f"; {count(len(removed), 'file')} of the wrong size or sha256 removed, to be fetched again: "
                 + ", ".join(removed))
    result["line"] = line
    result["progress"] = describe(progress.doc)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
