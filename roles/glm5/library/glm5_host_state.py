#!/usr/bin/python
"""Ansible module: the host's deployment state, against the record of the last full run.

A no-op run of site.yml asks the host hundreds of questions whose answers have not
changed since the last run. This module takes, in one round trip, a snapshot of every
thing the roles manage or read on the host (the no-op shortcut), as digests per part:

- ``files:<root>``: every entry under each root (lstat: type, mode, owner, group, size,
  mtime and ctime in ns, inode, a link's target). ctime cannot be set back by a user, so
  any write, chmod, chown, rename or removal under a root shows, the service's own
  writes included (its state and cache directories are not under a root).
- ``units``: systemd's state (load, active, sub, unit file state, need-daemon-reload) of
  every unit with a file or an enablement link in /etc/systemd/system, and of I(units).
- ``boot``: the boot id and the running kernel (a reboot or a new kernel ends a match).
- ``nvidia``: the loaded driver's version and the GPUs it lists (when loaded).
- ``command:<argv>``: exit status and output of each of I(commands) (live settings the
  roles check, e.g. GPU power limits).
- ``health``: the HTTP status of I(health_url) (the service answers).

I(state=probe) compares the snapshot and I(inputs) (the digest of the run's settings and
the project's files, computed on the controller) with the record at I(record); it
reports C(unchanged) true only when every part and the inputs are equal, else the parts
that differ. I(state=record) writes the snapshot and I(inputs) to I(record) (mode 0600,
root), not in check mode. Neither changes anything the roles manage.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_host_state
short_description: Snapshot of the deployment's host state, compared with or written to a record
description:
  - One round trip. Digests of every entry under I(roots), the state of the deployment's
    systemd units, the boot, the NVIDIA driver, I(commands) and I(health_url).
  - state=probe compares them and I(inputs) with I(record) (unchanged true when all are
    equal); state=record writes them there (not in check mode).
options:
  state: {description: probe or record., type: str, choices: [probe, record], required: true}
  inputs:
    description: Digests of the run's inputs by name (settings, project files, ...; computed on the controller).
    type: dict
    required: true
  record: {description: The record's path on the host., type: path, default: /var/lib/glm5-run/record.json}
  roots:
    description:
      - Absolute paths whose entries are part of the state, each a path (its whole tree) or
        a mapping path/depth (0 the path alone, -1 the whole tree). A missing root is
        recorded as missing; a root inside a whole tree taken already is not walked twice.
    type: list
    elements: raw
    required: true
  exclude:
    description: Directories under a root whose entries are skipped (the directory itself is kept).
    type: list
    elements: path
    default: []
  units:
    description: Units whose state is recorded besides those found in /etc/systemd/system.
    type: list
    elements: str
    default: []
  commands:
    description: Commands (argv) whose exit status and output are part of the state.
    type: list
    elements: list
    default: []
  health_url: {description: URL whose HTTP status is part of the state (empty for none)., type: str, default: ""}
  take:
    description:
      - (probe) Whether this run may take the shortcut. A probe that does not end in a match
        (or may not take it) removes the record, not in check mode, so that only a full run
        that ends well records again.
    type: bool
    default: true
  max_age:
    description: A record older than this many seconds never matches (roles decide some things by the clock).
    type: int
    default: 86400
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_host_state:
    state: probe
    inputs: "{{ glm5__run_inputs }}"
    roots: [{path: /etc, depth: -1}, {path: /var/lib/dpkg/status, depth: 0}]
  register: host_state
"""

RETURN = r"""
unchanged: {description: (probe) Inputs and every part equal the record., type: bool, returned: always}
differ: {description: (probe) The parts that differ, or why there is no match., type: list, returned: always}
parts: {description: Digest of each part of the snapshot., type: dict, returned: always}
entries: {description: Number of file entries in the snapshot., type: int, returned: always}
"""

UNIT_SUFFIXES = (".service", ".socket", ".timer", ".path", ".mount", ".target")
UNIT_DIR = "/etc/systemd/system"
UNIT_PROPERTIES = "Id,LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload"


def _entry_line(rel: str, st: os.stat_result, link: str) -> str:
    return "\0".join(
        str(v)
        for v in (
            rel,
            st.st_mode,
            st.st_uid,
            st.st_gid,
            st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
            link,
        )
    )


def walk_root(path: str, depth: int, exclude: set[str]) -> tuple[str, int]:
    """Digest of every entry under path (depth levels, -1: all) and how many there were."""
    digest = hashlib.sha256()
    count = 0
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        digest.update(b"missing")
        return digest.hexdigest(), 0
    stack: list[tuple[str, int]] = []
    digest.update(_entry_line(".", top, "").encode("utf-8", "surrogateescape") + b"\n")
    if stat.S_ISDIR(top.st_mode) and depth != 0:
        stack.append((path, 1))
    while stack:
        directory, level = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            digest.update(f"{directory}: unreadable {err.errno}\n".encode())
            continue
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            count += 1
            link = str(Path(entry.path).readlink()) if stat.S_ISLNK(st.st_mode) else ""
            rel = os.path.relpath(entry.path, path)
            digest.update(_entry_line(rel, st, link).encode("utf-8", "surrogateescape") + b"\n")
            if (
                stat.S_ISDIR(st.st_mode)
                and entry.path not in exclude
                and (depth < 0 or level < depth)
            ):
                stack.append((entry.path, level + 1))
    return digest.hexdigest(), count


def deployment_units(extra: list[str]) -> list[str]:
    """Units with a file or an enablement link in /etc/systemd/system, and extra."""
    names = set(extra)
    top = Path(UNIT_DIR)
    if not top.is_dir():
        return sorted(names)
    for full in top.iterdir():
        if full.name.endswith(UNIT_SUFFIXES) and not full.is_dir():
            names.add(full.name)
        elif full.name.endswith((".wants", ".requires")) and full.is_dir():
            names.update(n.name for n in full.iterdir() if n.name.endswith(UNIT_SUFFIXES))
    return sorted(names)


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"error {type(err).__name__}"
    out = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
    return f"rc {proc.returncode}\n{out}"


def units_state(names: list[str]) -> str:
    if not names:
        return "none"
    return _run(["systemctl", "show", f"--property={UNIT_PROPERTIES}", "--", *names])


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "missing"


def nvidia_state() -> str:
    gpus_dir = Path("/proc/driver/nvidia/gpus")
    gpus = sorted(p.name for p in gpus_dir.iterdir()) if gpus_dir.is_dir() else []
    return _read("/proc/driver/nvidia/version") + "\n" + " ".join(gpus)


def health_state(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as err:
        return str(err.code)
    except (OSError, ValueError) as err:
        return f"error {type(err).__name__}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def normalize_roots(roots: list[Any]) -> list[tuple[str, int]]:
    """(path, depth) of each root, sorted, without a root inside a whole tree taken already."""
    wanted: dict[str, int] = {}
    for root in roots:
        path, depth = (root, -1) if isinstance(root, str) else (str(root["path"]), int(root.get("depth", -1)))
        path = os.path.normpath(path)
        wanted[path] = -1 if -1 in (depth, wanted.get(path, depth)) else max(depth, wanted.get(path, depth))
    trees = [p for p, d in wanted.items() if d < 0]
    return [
        (path, depth)
        for path, depth in sorted(wanted.items())
        if not any(path != tree and path.startswith(tree.rstrip("/") + "/") for tree in trees)
    ]


def snapshot(params: dict[str, Any]) -> tuple[dict[str, str], int]:
    """Digest of each part of the host's state."""
    exclude = {os.path.normpath(p) for p in params["exclude"]}
    parts: dict[str, str] = {}
    total = 0
    for path, depth in normalize_roots(params["roots"]):
        digest, count = walk_root(path, depth, exclude)
        parts[f"files:{path}"] = digest
        total += count
    parts["units"] = _sha(units_state(deployment_units(params["units"])))
    boot = _read("/proc/sys/kernel/random/boot_id") + _read("/proc/sys/kernel/osrelease")
    parts["boot"] = _sha(boot)
    parts["nvidia"] = _sha(nvidia_state())
    for argv in params["commands"]:
        argv = [str(a) for a in argv]
        parts["command:" + " ".join(argv)] = _sha(_run(argv))
    if params["health_url"]:
        parts["health"] = _sha(health_state(params["health_url"]))
    return parts, total


def compare(
    record: dict[str, Any] | None,
    inputs: dict[str, str],
    parts: dict[str, str],
    max_age: int = 86400,
    now: float | None = None,
) -> list[str]:
    """What differs between the record and now (empty: nothing)."""
    if record is None:
        return ["no record of an earlier full run"]
    differ: list[str] = []
    now = time.time() if now is None else now
    recorded_at = record.get("recorded_at")
    if not isinstance(recorded_at, (int, float)) or not now - max_age <= recorded_at <= now + 300:
        # Roles decide some things by the clock (a certificate renewed within its window):
        # a full run at least every max_age seconds.
        differ.append(f"the record is older than {max_age} s (or not dated)")
    recorded = record.get("inputs")
    if not isinstance(recorded, dict):
        recorded = {}
    differ.extend(
        f"inputs: {name}"
        for name in sorted(set(inputs) | set(recorded))
        if inputs.get(name) != recorded.get(name)
    )
    before = record.get("parts", {})
    differ.extend(f"{name}: not in the record" for name in sorted(set(parts) - set(before)))
    differ.extend(f"{name}: no longer probed" for name in sorted(set(before) - set(parts)))
    differ.extend(name for name in sorted(set(parts) & set(before)) if parts[name] != before[name])
    return differ


def load_record(path: str) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(path: str, content: str) -> None:
    directory = Path(path).parent
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".run-record.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        Path(tmp).chmod(0o600)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink()
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["probe", "record"], "required": True},
            "inputs": {"type": "dict", "required": True},
            "record": {"type": "path", "default": "/var/lib/glm5-run/record.json"},
            "roots": {"type": "list", "elements": "raw", "required": True},
            "exclude": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "commands": {"type": "list", "elements": "list", "default": []},
            "health_url": {"type": "str", "default": ""},
            "max_age": {"type": "int", "default": 86400},
            "take": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    for root in params["roots"]:
        path = root if isinstance(root, str) else root.get("path", "") if isinstance(root, dict) else ""
        if not Path(str(path)).is_absolute():
            module.fail_json(msg=f"roots: each must be an absolute path or a mapping path/depth, got {root!r}")
    parts, entries = snapshot(params)
    if params["state"] == "probe":
        differ = compare(load_record(params["record"]), params["inputs"], parts, params["max_age"])
        if not params["take"]:
            differ = [*differ, "the shortcut is not taken in this run"]
        if differ and not module.check_mode:
            # A full run follows: until it records again, no record may vouch for this host
            # (a run that fails halfway, or in verify, must not leave the old one behind).
            Path(params["record"]).unlink(missing_ok=True)
        module.exit_json(
            changed=False, unchanged=not differ, differ=differ, parts=parts, entries=entries
        )
    if not module.check_mode:
        record = {"inputs": params["inputs"], "parts": parts, "recorded_at": int(time.time())}
        write_record(params["record"], json.dumps(record, sort_keys=True))
    # Bookkeeping of the run, not a change of the deployment: never reported as changed.
    module.exit_json(changed=False, unchanged=True, differ=[], parts=parts, entries=entries)


if __name__ == "__main__":
    main()
