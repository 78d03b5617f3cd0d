#!/usr/bin/python
"""Ansible module: who listens on a TCP port (from /proc), and in which systemd unit."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_port_owner
short_description: Report the processes and systemd units listening on a TCP port
description:
  - Reads /proc/net/tcp and /proc/net/tcp6 for listening sockets on I(port), maps their
    inodes to processes through /proc/<pid>/fd, and those to units through
    /proc/<pid>/cgroup. Read-only; needs root to see other users' sockets.
options:
  port: {description: TCP port., type: int, required: true}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_port_owner:
    port: 8000
  register: owner
"""

RETURN = r"""
listening: {description: Whether anything listens on the port., type: bool, returned: always}
pids: {description: Processes holding a listening socket on it., type: list, returned: always}
units: {description: systemd units of those processes (e.g. vllm-glm-5.service)., type: list, returned: always}
"""

LISTEN = "0A"
UNIT = re.compile(r"([^/]+\.(?:service|scope))$")


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def owners(inodes: set[str], proc: Path = Path("/proc")) -> tuple[list[int], list[str]]:
    wanted = {f"socket:[{i}]" for i in inodes}
    pids: list[int] = []
    units: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in wanted:
                pids.append(int(entry.name))
                try:
                    for line in (entry / "cgroup").read_text().splitlines():
                        m = UNIT.search(line.rsplit(":", 1)[-1])
                        if m:
                            units.add(m.group(1))
                except OSError:
                    pass
                break
    return sorted(pids), sorted(units)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"port": {"type": "int", "required": True}}, supports_check_mode=True
    )
    inodes = listening_inodes(module.params["port"])
    pids, units = owners(inodes) if inodes else ([], [])
    module.exit_json(changed=False, listening=bool(inodes), pids=pids, units=units)


if __name__ == "__main__":
    main()
