#!/usr/bin/python
"""Ansible module: what the validation phase must ask the host itself, in one round trip.

Read-only. The settings' paths as the host resolves them (symbolic links followed), CA
bundles as OpenSSL loads them, who listens on the settings' ports (process, command,
systemd unit), which ports SSH takes, and where the kernel's privileged port range ends.
Role glm5's filter glm5_host_refusals turns the answers into refusal lines.
"""

from __future__ import annotations

import os
import re
import shlex
import ssl
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_host_probe
short_description: Read what the validation phase checks on the host (paths, CA bundles, ports, SSH)
description:
  - C(paths) are resolved with realpath (every symbolic link followed; a part that does
    not exist yet is kept as written).
  - C(pem_files) are loaded as OpenSSL loads a CA bundle (pip, uv and huggingface do the
    same); the number of certificates is returned, or why loading failed.
  - C(ports) are looked up in /proc/net/tcp and tcp6 (LISTEN); each listening socket is
    mapped to its process through /proc/<pid>/fd and to its systemd unit through
    /proc/<pid>/cgroup. Without CAP_SYS_PTRACE (containers) root cannot read other users'
    fds; then a socket counts as a unit's of C(units), else of the units C(unit_globs)
    names, when that unit's main process has the socket's owner uid.
  - SSH's ports are 22, what sshd listens on, what ssh.socket / sshd.socket listen on,
    and the Port / ListenAddress lines of /etc/ssh/sshd_config and the files it includes.
  - C(unit_globs) lists the units that files matching them stand for (role vllm_service:
    /etc/glm5/*.cmdline, one per unit it installed, under any served name).
options:
  paths: {description: Paths to resolve., type: list, elements: str, default: []}
  pem_files: {description: CA bundle files to load., type: list, elements: str, default: []}
  ports: {description: TCP ports to look up., type: list, elements: int, default: []}
  units:
    description: Units whose main process may own a socket whose process cannot be read.
    type: list
    elements: str
    default: []
  unit_globs:
    description: Globs of files named <unit stem>.<suffix>; each stem + .service is returned.
    type: list
    elements: str
    default: []
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_host_probe:
    paths: [/srv/models/glm-5]
    pem_files: [/etc/ssl/certs/ca-certificates.crt]
    ports: [8000]
  register: probe
"""

RETURN = r"""
paths: {description: "{path: {realpath, exists}}", type: dict, returned: always}
pem: {description: "{path: {exists, is_file, certificates, error}}", type: dict, returned: always}
listeners:
  description: "{port: [{pid, command, unit, uid}]}, only for the ports something listens on"
  type: dict
  returned: always
ssh_ports: {description: "{port: why it is SSH's}", type: dict, returned: always}
unprivileged_port_start:
  description: The lowest port an unprivileged process may bind (net.ipv4.ip_unprivileged_port_start).
  type: int
  returned: always
glob_units: {description: Units named by the files matching unit_globs., type: list, returned: always}
"""

LISTEN = "0A"
UNIT = re.compile(r"([^/]+\.(?:service|scope|socket))$")
PEM_LIMIT = 64 * 1024 * 1024
SSH_UNITS = {"ssh.service", "sshd.service", "ssh.socket", "sshd.socket"}
SSHD_CONFIG = Path("/etc/ssh/sshd_config")


def resolve(paths: list[str]) -> dict[str, dict[str, Any]]:
    return {p: {"realpath": os.path.realpath(p), "exists": os.path.lexists(p)} for p in paths}


def load_pem(path: str) -> dict[str, Any]:
    """How OpenSSL loads ``path`` as a CA bundle."""
    file = Path(path)
    out: dict[str, Any] = {"exists": file.exists(), "is_file": file.is_file(), "certificates": 0, "error": ""}
    if not out["is_file"]:
        return out
    try:
        if file.stat().st_size > PEM_LIMIT:
            out["error"] = f"larger than {PEM_LIMIT // (1024 * 1024)} MiB"
            return out
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cafile=path)
        out["certificates"] = int(context.cert_store_stats().get("x509", 0))
    except (OSError, ssl.SSLError, ValueError) as exc:
        out["error"] = str(exc).strip() or type(exc).__name__
    return out


def listening_sockets(proc: Path = Path("/proc")) -> dict[str, tuple[int, int]]:
    """{inode: (port, owner uid)} of every socket in LISTEN state (IPv4 and IPv6)."""
    sockets: dict[str, tuple[int, int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            sockets[fields[9]] = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[7]))
    return sockets


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def process(pid: int, proc: Path = Path("/proc")) -> dict[str, Any]:
    """pid, command line (or name), systemd unit and uid of a process."""
    entry = proc / str(pid)
    try:
        raw = (entry / "cmdline").read_bytes()
    except OSError:
        raw = b""
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    command = shlex.join(words) if words else _read(entry / "comm").strip()
    unit = ""
    for line in _read(entry / "cgroup").splitlines():
        match = UNIT.search(line.rsplit(":", 1)[-1])
        if match:
            unit = match.group(1)
            break
    uid = None
    for line in _read(entry / "status").splitlines():
        if line.startswith("Uid:"):
            try:
                uid = int(line.split()[1])
            except (IndexError, ValueError):
                uid = None
    return {"pid": pid, "command": command, "unit": unit, "uid": uid,
            "name": _read(entry / "comm").strip()}


def socket_owners(inodes: set[str], proc: Path = Path("/proc")) -> dict[str, list[int]]:
    """{inode: [pids]} for the sockets of ``inodes`` whose process fds can be read."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    found: dict[str, list[int]] = {}
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
            inode = wanted.get(target)
            if inode is not None and int(entry.name) not in found.setdefault(inode, []):
                found[inode].append(int(entry.name))
    return found


def absolute_glob(pattern: str) -> list[Path]:
    """The paths an absolute glob ``pattern`` matches, sorted ([] for a relative one)."""
    if not pattern.startswith("/"):
        return []
    return sorted(Path("/").glob(pattern.lstrip("/")))


def sshd_config_ports(config: Path = SSHD_CONFIG) -> dict[int, str]:
    """Ports from sshd_config's Port and ListenAddress lines (and the files it includes)."""
    ports: dict[int, str] = {}
    seen: set[Path] = set()

    def read(path: Path) -> None:
        if path in seen:
            return
        seen.add(path)
        for raw in _read(path).splitlines():
            words = raw.split("#", 1)[0].split()
            if len(words) < 2:
                continue
            key = words[0].lower()
            if key == "include":
                for pattern in words[1:]:
                    for name in absolute_glob(pattern if pattern.startswith("/") else str(config.parent / pattern)):
                        read(name)
            elif key == "port" and words[1].isdigit():
                ports.setdefault(int(words[1]), f"{path}: Port {words[1]}")
            elif key == "listenaddress":
                match = re.search(r":(\d+)$", words[1])
                if match and (words[1].startswith("[") or words[1].count(":") == 1):
                    ports.setdefault(int(match.group(1)), f"{path}: ListenAddress {words[1]}")

    read(config)
    return ports


def socket_unit_ports(module: AnsibleModule) -> dict[int, str]:
    """What ssh.socket / sshd.socket listen on (systemctl show -p Listen)."""
    ports: dict[int, str] = {}
    if not module.get_bin_path("systemctl"):
        return ports
    for unit in ("ssh.socket", "sshd.socket"):
        rc, out, _ = module.run_command(["systemctl", "show", "-p", "Listen", "--value", unit])
        if rc != 0:
            continue
        for listen in out.split("\n"):
            match = re.search(r"(?:^|:)(\d+) \(Stream\)", listen.strip())
            if match:
                ports.setdefault(int(match.group(1)), f"{unit} listens on {listen.split(' (')[0].strip()} on this host")
    return ports


def main_uid(module: AnsibleModule, unit: str, proc: Path = Path("/proc")) -> int | None:
    rc, out, _ = module.run_command(["systemctl", "show", "-p", "MainPID", "--value", unit])
    pid = out.strip() if rc == 0 else ""
    if pid in {"", "0"} or not pid.isdigit():
        return None
    uid = process(int(pid), proc)["uid"]
    return uid if isinstance(uid, int) else None


def unprivileged_port_start(proc: Path = Path("/proc")) -> int:
    text = _read(proc / "sys/net/ipv4/ip_unprivileged_port_start").strip()
    return int(text) if text.isdigit() else 1024


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "str", "default": []},
            "pem_files": {"type": "list", "elements": "str", "default": []},
            "ports": {"type": "list", "elements": "int", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "unit_globs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    sockets = listening_sockets()
    owners = socket_owners(set(sockets))
    processes = {pid: process(pid) for pids in owners.values() for pid in pids}

    ssh_ports: dict[int, str] = {22: "its standard port"}
    for port, why in {**sshd_config_ports(), **socket_unit_ports(module)}.items():
        ssh_ports.setdefault(port, why)
    for inode, (port, _uid) in sockets.items():
        for pid in owners.get(inode, []):
            info = processes[pid]
            if info["name"] == "sshd" or info["unit"] in SSH_UNITS:
                ssh_ports.setdefault(port, f"sshd listens on it on this host, pid {pid}")

    glob_units: list[str] = []
    for pattern in params["unit_globs"]:
        for name in absolute_glob(pattern):
            unit = name.name.rsplit(".", 1)[0] + ".service"
            if unit not in glob_units:
                glob_units.append(unit)

    wanted = set(params["ports"])
    listeners: dict[str, list[dict[str, Any]]] = {}
    unit_uids: dict[str, int | None] = {}
    for inode, (port, uid) in sorted(sockets.items(), key=lambda item: item[1]):
        if port not in wanted:
            continue
        entries = listeners.setdefault(str(port), [])
        pids = owners.get(inode, [])
        if not pids:
            # The process cannot be read (another user's, without CAP_SYS_PTRACE): a
            # unit of `units` whose main process has the socket's uid, then one of the
            # units the globs name (the same service under an earlier name), else the uid.
            unit = ""
            for candidate in [*params["units"], *(u for u in glob_units if u not in params["units"])]:
                if candidate not in unit_uids:
                    unit_uids[candidate] = main_uid(module, candidate)
                if unit_uids[candidate] == uid:
                    unit = candidate
                    break
            entry = {"pid": None, "command": "", "unit": unit, "uid": uid}
            if entry not in entries:
                entries.append(entry)
            continue
        for pid in pids:
            info = processes[pid]
            entry = {"pid": pid, "command": info["command"], "unit": info["unit"], "uid": info["uid"]}
            if entry not in entries:
                entries.append(entry)

    module.exit_json(
        changed=False,
        paths=resolve(params["paths"]),
        pem={p: load_pem(p) for p in params["pem_files"]},
        listeners=listeners,
        ssh_ports={str(k): v for k, v in sorted(ssh_ports.items())},
        unprivileged_port_start=unprivileged_port_start(),
        glob_units=glob_units,
    )


if __name__ == "__main__":
    main()
