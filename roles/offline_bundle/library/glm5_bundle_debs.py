#!/usr/bin/python
"""Ansible module: a flat apt repository of some packages and everything they depend on.

Runs on the connected builder, which must be the target's distribution release and
architecture with the same apt sources the target would use (NVIDIA's repository
included). The full dependency closure is downloaded, not only what the builder
lacks, so the repository installs on a minimal target; apt on the target takes only
what it is missing.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_bundle_debs
short_description: Download packages with their dependency closure into a flat apt repository
description:
  - Resolves I(packages) with C(apt-cache depends --recurse) (Depends and Pre-Depends;
    no Recommends or Suggests), downloads every resolved package that is missing from
    I(dest) (sha256 checked against apt's index), removes .deb files no longer in the set,
    and writes C(Packages) and C(Release) (apt-ftparchive) when the set changed.
  - A second run with the same apt candidates changes nothing.
options:
  dest: {description: The repository directory., type: path, required: true}
  packages: {description: Package names to include., type: list, elements: str, required: true}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_bundle_debs:
    dest: /srv/glm5-bundle/debs
    packages: [nvidia-open-580, cuda-toolkit-13-0, python3.12-venv]
"""

RETURN = r"""
packages: {description: File names of the .deb files in the repository., type: list, returned: always}
downloaded: {description: Files downloaded this run., type: list, returned: always}
removed: {description: Stale files removed this run., type: list, returned: always}
"""

URI_LINE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) (?P<hash>\S+)$")


def parse_depends(text: str) -> list[str]:
    """Real package names from `apt-cache depends --recurse` output: its unindented lines,
    less virtual packages (<name>)."""
    names: list[str] = []
    for line in text.splitlines():
        if not line or line[0].isspace() or line.startswith("<"):
            continue
        name = line.strip()
        if name not in names:
            names.append(name)
    return names


def parse_print_uris(text: str) -> dict[str, dict[str, Any]]:
    """`apt-get download --print-uris` lines -> file name -> uri, size, sha256 (empty if apt gave another algorithm)."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        match = URI_LINE.match(line.strip())
        if not match:
            continue
        algo, _, digest = match["hash"].partition(":")
        # The file name as apt-get download saves it (an epoch's ":" stays quoted as %3a).
        out[match["file"]] = {
            "uri": match["uri"],
            "size": int(match["size"]),
            "sha256": digest.lower() if algo.upper() == "SHA256" else "",
        }
    return out


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_current(path: Path, want: dict[str, Any]) -> bool:
    if not path.is_file() or path.stat().st_size != want["size"]:
        return False
    return not want["sha256"] or sha256_file(path) == want["sha256"]


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def run(dest: Path, packages: list[str], check_mode: bool) -> dict[str, Any]:
    depends = _run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
         "--no-breaks", "--no-replaces", "--no-enhances", *packages]
    )
    names = parse_depends(depends)
    missing_roots = [p for p in packages if p not in names]
    if missing_roots:
        raise RuntimeError(f"apt knows no package {', '.join(missing_roots)} (is the builder's apt source for it set up?)")
    wanted = parse_print_uris(_run(["apt-get", "download", "--print-uris", *names]))
    todo = [name for name, want in sorted(wanted.items()) if not is_current(dest / name, want)]
    stale = sorted(p.name for p in dest.glob("*.deb") if p.name not in wanted) if dest.is_dir() else []
    changed = bool(todo or stale) or not (dest / "Packages").is_file() or not (dest / "Release").is_file()
    result: dict[str, Any] = {"changed": changed, "packages": sorted(wanted), "downloaded": todo, "removed": stale}
    if check_mode or not changed:
        return result
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / ".partial"
    partial.mkdir(exist_ok=True)
    by_file = {name: want for name, want in wanted.items()}
    if todo:
        # apt-get download wants package names; map each file back to its name=version.
        specs = [_spec(name) for name in todo]
        _run(["apt-get", "download", *specs], cwd=partial)
        for name in todo:
            got = partial / name
            if not is_current(got, by_file[name]):
                raise RuntimeError(f"{name}: downloaded file does not match apt's index (size or sha256)")
            got.replace(dest / name)
    partial.rmdir()
    for name in stale:
        (dest / name).unlink()
    packages_text = _run(["apt-ftparchive", "packages", "."], cwd=dest)
    packages_file = dest / "Packages"
    if not packages_file.is_file() or packages_file.read_text() != packages_text or not (dest / "Release").is_file():
        packages_file.write_text(packages_text)
        (dest / "Release").write_text(_run(["apt-ftparchive", "release", "."], cwd=dest))
    return result


def _spec(filename: str) -> str:
    """name_version_arch.deb -> name:arch=version (the epoch was URL-quoted in the file name)."""
    stem = filename[: -len(".deb")]
    name, version, arch = stem.split("_")
    version = urllib.parse.unquote(version)
    return f"{name}:{arch}={version}" if arch != "all" else f"{name}={version}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "packages": {"type": "list", "elements": "str", "required": True},
        },
        supports_check_mode=True,
    )
    try:
        result = run(Path(module.params["dest"]), module.params["packages"], module.check_mode)
    except (RuntimeError, OSError, ValueError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
