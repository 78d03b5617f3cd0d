#!/usr/bin/python
"""Ansible module: a flat apt repository of some packages and everything they depend on.

Runs on the connected builder, which must be the target's distribution release and
architecture with the same apt sources the target would use (NVIDIA's repository
included). The set is resolved as for an empty system, not only what the
builder lacks, so the repository installs on a minimal target; apt on the target takes
only what it is missing.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_bundle_debs
short_description: Download packages with their dependency closure into a flat apt repository
description:
  - Resolves I(packages) with apt's own solver as for an empty system (C(apt-get install
    --print-uris) against an empty dpkg status: every dependency, first alternatives, the
    builder's pins; no Recommends), downloads every resolved package missing from I(dest)
    (checked against apt's index), removes .deb files no longer in the set, and writes
    C(Packages) and C(Release) (apt-ftparchive) when the set changed.
  - A second run with the same apt candidates changes nothing.
options:
  dest: {description: The repository directory., type: path, required: true}
  packages: {description: Package names to include., type: list, elements: str, required: true}
  preferences:
    description:
      - apt preferences the solver uses instead of the builder's own (the pins the target
        will have, e.g. role nvidia_driver's branch pin), so the set holds the versions the
        target's apt will choose.
    type: str
    default: ""
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


def parse_print_uris(text: str) -> dict[str, dict[str, Any]]:
    """`apt-get --print-uris` lines -> file name -> uri, size, hash algorithm and digest."""
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
            "algo": algo.lower().replace("sum", ""),
            "digest": digest.lower(),
        }
    return out


def hash_file(path: Path, algo: str) -> str:
    digest = hashlib.new(algo)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_current(path: Path, want: dict[str, Any]) -> bool:
    if not path.is_file() or path.stat().st_size != want["size"]:
        return False
    if want["algo"] not in {"md5", "sha1", "sha256", "sha512"}:
        return False
    return hash_file(path, want["algo"]) == str(want["digest"])


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def run(dest: Path, packages: list[str], preferences: str, check_mode: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="glm5-bundle-debs-") as tmp:
        scratch = Path(tmp)
        (scratch / "archives" / "partial").mkdir(parents=True)
        (scratch / "preferences.d").mkdir()
        (scratch / "status").write_text("")
        (scratch / "preferences").write_text(preferences)
        uris = _run(
            [
                "apt-get",
                "install",
                "--print-uris",
                "-qq",
                "--no-install-recommends",
                f"-o=Dir::State::status={scratch}/status",
                f"-o=Dir::Cache::archives={scratch}/archives/",
                f"-o=Dir::Etc::preferences={scratch}/preferences",
                f"-o=Dir::Etc::preferencesparts={scratch}/preferences.d",
                "-o=Debug::NoLocking=1",
                *packages,
            ]
        )
    wanted = parse_print_uris(uris)
    if not wanted:
        raise RuntimeError(f"apt resolved nothing for {', '.join(packages)}")
    todo = [name for name, want in sorted(wanted.items()) if not is_current(dest / name, want)]
    stale = sorted(p.name for p in dest.glob("*.deb") if p.name not in wanted) if dest.is_dir() else []
    changed = bool(todo or stale) or not (dest / "Packages").is_file() or not (dest / "Release").is_file()
    result: dict[str, Any] = {"changed": changed, "packages": sorted(wanted), "downloaded": todo, "removed": stale}
    if check_mode or not changed:
        return result
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / ".partial"
    shutil.rmtree(partial, ignore_errors=True)  # what an interrupted run left
    partial.mkdir()
    by_file = {name: want for name, want in wanted.items()}
    if todo:
        # apt-get download wants package names; map each file back to its name=version.
        specs = [_spec(name) for name in todo]
        _run(["apt-get", "download", *specs], cwd=partial)
        for name in todo:
            got = partial / name
            if not is_current(got, by_file[name]):
                raise RuntimeError(f"{name}: downloaded file does not match apt's index (size or hash)")
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
            "preferences": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    try:
        result = run(
            Path(module.params["dest"]), module.params["packages"], module.params["preferences"], module.check_mode
        )
    except (RuntimeError, OSError, ValueError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
