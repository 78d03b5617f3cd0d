#!/usr/bin/python
# Copyright: the glm5-deploy authors
# Apache-2.0
"""Wait, within a bound, until no other process holds dpkg's and apt's locks."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: glm5_dpkg_lock
short_description: Wait, within a bound, until no other process holds dpkg's and apt's locks
description:
  - Asks the kernel (fcntl F_GETLK, which takes no lock) whether another process holds
    one of the lock files apt and dpkg take before they change anything, and waits
    while one does, up to I(timeout) seconds.
  - When a lock is still held then, fails with one line naming the lock file and the
    holder (its pid and command line); nothing was changed.
  - Read-only; reports ok (never changed), in check mode too.
options:
  paths:
    description: The lock files, in the order apt takes them.
    type: list
    elements: path
    default:
      - /var/lib/dpkg/lock-frontend
      - /var/lib/dpkg/lock
      - /var/cache/apt/archives/lock
      - /var/lib/apt/lists/lock
  timeout:
    description: Seconds to wait for the locks to be free.
    type: int
    default: 120
  interval:
    description: Seconds between two looks.
    type: float
    default: 1.0
  setting:
    description: The variable that sets I(timeout), named in the refusal.
    type: str
    default: glm5_apt_lock_timeout
"""

RETURN = r"""
waited:
  description: Seconds waited until the locks were free.
  type: float
  returned: success
held:
  description: The lock that was held (path, pid, command), when one was seen.
  type: dict
  returned: when a lock was held at some point
"""

# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid (native alignment; padded to the kernel's size).
_FLOCK = "hhqqi"
_FLOCK_SIZE = struct.calcsize(_FLOCK) + (-struct.calcsize(_FLOCK)) % 8


def holder(path: Path) -> int | None:
    """The pid holding a write-conflicting lock on path, 0 when the holder is not
    visible from here, None when nothing holds it (or the file does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(_FLOCK_SIZE, b"\0")
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    finally:
        os.close(fd)
    l_type, _whence, _start, _len, pid = struct.unpack(_FLOCK, answer[: struct.calcsize(_FLOCK)])
    if l_type == fcntl.F_UNLCK:
        return None
    return pid if pid > 0 else 0


def command_of(pid: int) -> str:
    if pid <= 0:
        return "a process not visible from here"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "a process that has ended"
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    text = " ".join(words) or "?"
    return text if len(text) <= 120 else text[:117] + "..."


def first_held(paths: list[Path]) -> tuple[Path, int] | None:
    for path in paths:
        pid = holder(path)
        if pid is not None:
            return path, pid
    return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {
                "type": "list",
                "elements": "path",
                "default": [
                    "/var/lib/dpkg/lock-frontend",
                    "/var/lib/dpkg/lock",
                    "/var/cache/apt/archives/lock",
                    "/var/lib/apt/lists/lock",
                ],
            },
            "timeout": {"type": "int", "default": 120},
            "interval": {"type": "float", "default": 1.0},
            "setting": {"type": "str", "default": "glm5_apt_lock_timeout"},
        },
        supports_check_mode=True,
    )
    paths = [Path(p) for p in module.params["paths"]]
    timeout = max(0, module.params["timeout"])
    start = time.monotonic()
    seen: dict[str, object] = {}
    while True:
        held = first_held(paths)
        waited = round(time.monotonic() - start, 1)
        if held is None:
            module.exit_json(changed=False, waited=waited, **({"held": seen} if seen else {}))
            return
        path, pid = held
        seen = {"path": str(path), "pid": pid, "command": command_of(pid)}
        if waited >= timeout:
            who = f"pid {pid} ({seen['command']})" if pid > 0 else str(seen["command"])
            module.fail_json(
                msg=(
                    f"{path} is still held by {who} after {waited:.0f} s "
                    f"({module.params['setting']} = {timeout}); nothing was installed. "
                    f"Let it finish or stop it, then run again."
                ),
                waited=waited,
                held=seen,
            )
        time.sleep(min(module.params["interval"], max(0.1, timeout - waited)))


if __name__ == "__main__":
    main()
