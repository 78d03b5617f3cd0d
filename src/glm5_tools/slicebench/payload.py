"""What the GPU machine is carried, pinned by the project's own locks.

``pins(lock, names, python)``: for each name, the ``name==version --hash=...`` line of a
uv-compiled lock (``--universal --generate-hashes``) whose environment marker holds for
CPython ``python`` on x86-64 Linux, so that ``pip download --require-hashes`` fetches
exactly the locked files for the GPU machine (tools/gpu/pack).
"""

from __future__ import annotations

import re
from pathlib import Path

_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?\s*$")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_holds(marker: str | None, python: str) -> bool:
    if not marker:
        return True
    from packaging.markers import Marker

    env = {"python_version": python, "python_full_version": f"{python}.3", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix"}
    return bool(Marker(marker).evaluate(env))


def entries(lock: Path, python: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of the lock's entries that hold for ``python``."""
    out: dict[str, tuple[str, list[str]]] = {}
    current: tuple[str, str] | None = None
    for line in lock.read_text().splitlines():
        m = _ENTRY.match(line)
        if m:
            name, version, marker = m.group(1), m.group(2), m.group(3)
            current = (_normal(name), version) if _marker_holds(marker, python) else None
            if current:
                out[current[0]] = (version, [])
            continue
        h = _HASH.search(line)
        if h and current:
            out[current[0]][1].append(h.group(1))
        elif not line.startswith(" "):
            current = None
    return out


def pins(lock: Path, names: list[str], python: str = "3.12") -> list[str]:
    found = entries(lock, python)
    missing = [n for n in names if _normal(n) not in found]
    if missing:
        raise ValueError(f"payload: not in {lock.name} for Python {python}: {', '.join(missing)}")
    lines = []
    for n in names:
        version, hashes = found[_normal(n)]
        lines.append(f"{_normal(n)}=={version} " + " ".join(f"--hash={h}" for h in hashes))
    return lines
