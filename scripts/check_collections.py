#!/usr/bin/env python3
"""Exit 0 when every collection in requirements.yml is installed at a satisfying version.

Used by scripts/bootstrap: where the `ansible` bundle already carries a
collection (the case on closed networks without Ansible Galaxy), nothing is
downloaded; otherwise bootstrap falls back to `ansible-galaxy collection install`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version


def installed_collections(galaxy: Path) -> dict[str, Version]:
    out = subprocess.run(
        [str(galaxy), "collection", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, Version] = {}
    for collections in json.loads(out).values():
        for name, meta in collections.items():
            version = Version(meta["version"])
            # The first path in COLLECTIONS_PATHS wins at run time; keep the newest seen.
            if name not in found or version > found[name]:
                found[name] = version
    return found


def missing(requirements: Path, installed: dict[str, Version]) -> list[str]:
    wanted = yaml.safe_load(requirements.read_text(encoding="utf-8"))["collections"]
    problems = []
    for item in wanted:
        name, spec = item["name"], SpecifierSet(item.get("version", "*").replace("*", ""))
        have = installed.get(name)
        if have is None:
            problems.append(f"{name}: not installed (wanted {spec or 'any'})")
        elif have not in spec:
            problems.append(f"{name}: {have} installed, wanted {spec}")
    return problems


def main() -> int:
    requirements = Path(sys.argv[1])
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    problems = missing(requirements, installed_collections(galaxy))
    for line in problems:
        print(f"check_collections: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
