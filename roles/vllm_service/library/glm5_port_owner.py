#!/usr/bin/python
"""Ansible module: who listens on a TCP port (from /proc), and in which systemd unit."""

from __future__ import annotations

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
  - Without CAP_SYS_PTRACE (containers) root cannot read other users' /proc/<pid>/fd;
    then a socket counts as the unit's when the unit is active and its main process
    has the socket's owner uid.
options:
  port: {description: TCP port., type: int, required: true}
  unit: {description: The unit expected to own the port (e.g. vllm-glm-5.service)., type: str, default: ""}
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
owned_by_unit: {description: Every listener belongs to I(unit)., type: bool, returned: always}
"""

LISTEN = "0A"
UNIT = re.compile(r"([^/]+\.(?:service|scope))$")


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    return set(listening_sockets(port, proc))


def listening_sockets(port: int, proc: Path = Path("/proc")) -> dict[str, int]:
    """{inode: owner uid} of sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    inodes: dict[str, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, uid, inode = fields[1], fields[3], fields[7], fields[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes[inode] = int(uid)
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
                target = str(fd.readlink())
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
        argument_spec={"port": {"type": "int", "required": True}, "unit": {"type": "str", "default": ""}},
        supports_check_mode=True,
    )
    sockets = listening_sockets(module.params["port"])
    unit = module.params["unit"]
    pids, units = owners(set(sockets)) if sockets else ([], [])
    owned = bool(sockets) and bool(unit) and units == [unit]
    if sockets and unit and not pids:
        rc, out, _ = module.run_command(["systemctl", "show", "-p", "MainPID", "--value", unit])
        main_pid = out.strip() if rc == 0 else ""
        uid = main_uid(Path("/proc"), main_pid) if main_pid not in {"", "0"} else None
        owned = uid is not None and set(sockets.values()) == {uid}
    module.exit_json(changed=False, listening=bool(sockets), pids=pids, units=units, owned_by_unit=owned)


def main_uid(proc: Path, pid: str) -> int | None:
    try:
        for line in (proc / pid / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


if __name__ == "__main__":
    main()
