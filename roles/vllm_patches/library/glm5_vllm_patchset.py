#!/usr/bin/python
# Copyright: the glm5-deploy authors
# Apache-2.0
"""Apply, detect or reverse the GLM-5 vLLM patch set, all or nothing."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: glm5_vllm_patchset
short_description: Apply or reverse the GLM-5 vLLM patch set, all or nothing
description:
  - Refuses, naming both versions, when the installed vLLM is not the version the
    patch set was made for; nothing is touched then.
  - Every patch is tried first on a staging copy of the files it touches (with the
    patch tool); the tree itself changes only when all of them applied there.
  - The applied patches are the longest prefix of the set whose reverses apply, newest
    first, in sequence on a staging copy (ok, not changed when that is the whole set).
  - Patched files are byte-compiled with the venv's Python; a manifest JSON records
    the patch set version, the vLLM version, the sha256 of each patch and of each
    patched file.
  - I(state=absent) reverses the applied patches and removes the manifest.
options:
  site_packages:
    description: The venv's site-packages directory (holds vllm/).
    type: path
    required: true
  patch_dir:
    description: Directory holding the numbered NNNN-*.patch files (paths inside
      relative to site-packages, one leading component stripped).
    type: path
    required: true
  patchset_version:
    description: vLLM version the patch set was made for.
    type: str
    required: true
  python:
    description: The venv's Python, used to byte-compile the patched files.
    type: path
    required: true
  manifest:
    description: Manifest path; default C(<site_packages>/vllm/.glm5-patchset.json).
    type: path
  state:
    description: present applies the set, absent reverses it.
    type: str
    choices: [present, absent]
    default: present
  patch_binary:
    description: The patch tool.
    type: str
    default: patch
"""

RETURN = r"""
vllm_version:
  description: Installed vLLM version.
  type: str
  returned: always
applied:
  description: Patches applied (present) or reversed (absent) by this run.
  type: list
  elements: str
  returned: success
files:
  description: Patched files (relative to site-packages) and their sha256.
  type: dict
  returned: success
manifest:
  description: The manifest path.
  type: str
  returned: success
"""


_PATCH_NAME = re.compile(r"^\d{4}-[A-Za-z0-9._-]+\.patch$")
_TARGET = re.compile(r"^\+\+\+ [^/\s]+/(\S+)", re.MULTILINE)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def installed_vllm_version(site_packages: Path) -> str | None:
    """Version from the vllm-*.dist-info METADATA, None when not installed."""
    for dist in sorted(site_packages.glob("vllm-*.dist-info")):
        metadata = dist / "METADATA"
        if not metadata.is_file():
            continue
        for line in metadata.read_text(encoding="utf-8").splitlines():
            if line.startswith("Name:") and line.split(":", 1)[1].strip() != "vllm":
                break
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def list_patches(patch_dir: Path) -> list[Path]:
    return sorted(p for p in patch_dir.iterdir() if _PATCH_NAME.match(p.name))


def patch_targets(patch: Path) -> list[str]:
    """Files a unified diff touches, relative to site-packages."""
    return sorted(set(_TARGET.findall(patch.read_text(encoding="utf-8"))))


class PatchSet:
    """The patch set against one site-packages tree."""

    def __init__(self, module: AnsibleModule, site: Path, patches: list[Path]) -> None:
        self.module = module
        self.site = site
        self.patches = patches
        self.patch_binary = module.get_bin_path(module.params["patch_binary"], True)

    def _run_patch(self, root: Path, patch: Path, *, reverse: bool) -> bool:
        cmd = [self.patch_binary, "-p1", "-s", "-f", "-N", "-d", str(root), "-i", str(patch)]
        if reverse:
            cmd.insert(1, "-R")
        rc, _out, _err = self.module.run_command(cmd)
        return bool(rc == 0)

    def applied(self) -> list[Path]:
        """The patches the tree has: the longest prefix of the set that reverses,
        newest first, in sequence on a staging copy. (Checking each patch alone on
        the tree is wrong once a later patch changed lines of an earlier one's
        context: the earlier one then no longer reverses by itself.)"""
        for count in range(len(self.patches), 0, -1):
            if self._reverses(self.patches[:count]):
                return self.patches[:count]
        return []

    def _reverses(self, patches: list[Path]) -> bool:
        staging = Path(tempfile.mkdtemp(prefix="glm5-patchset-"))
        try:
            for rel in sorted({t for p in patches for t in patch_targets(p)}):
                if not (self.site / rel).is_file():
                    return False
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.site / rel, staging / rel)
            return all(self._run_patch(staging, p, reverse=True) for p in reversed(patches))
        finally:
            shutil.rmtree(staging)

    def stage(self, patches: list[Path], *, reverse: bool) -> tuple[Path, list[str]]:
        """Apply patches (in order) to a staging copy; fail with nothing touched."""
        staging = Path(tempfile.mkdtemp(prefix="glm5-patchset-"))
        targets = sorted({t for p in patches for t in patch_targets(p)})
        for rel in targets:
            source = self.site / rel
            if not source.is_file():
                shutil.rmtree(staging)
                self.module.fail_json(msg=f"{rel} is missing from {self.site}")
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, staging / rel)
        for patch in patches:
            if not self._run_patch(staging, patch, reverse=reverse):
                shutil.rmtree(staging)
                verb = "reverse" if reverse else "apply"
                self.module.fail_json(
                    msg=(
                        f"{patch.name} does not {verb} cleanly to {self.site}; nothing was changed"
                    )
                )
        return staging, targets

    def install(self, staging: Path, targets: list[str]) -> None:
        """Move staged files over the tree, one atomic rename each."""
        for rel in targets:
            dest = self.site / rel
            staged = staging / rel
            shutil.copymode(dest, staged)
            tmp = dest.with_name(f".{dest.name}.glm5-new")
            shutil.copy2(staged, tmp)
            tmp.replace(dest)
        shutil.rmtree(staging)


def manifest_data(
    site: Path, patches: list[Path], patchset_version: str, vllm_version: str
) -> dict[str, Any]:
    targets = sorted({t for p in patches for t in patch_targets(p)})
    return {
        "patchset_version": patchset_version,
        "vllm_version": vllm_version,
        "patches": {p.name: sha256_file(p) for p in patches},
        "files": {rel: sha256_file(site / rel) for rel in targets},
    }


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(path)


def byte_compile(module: AnsibleModule, python: str, site: Path, targets: list[str]) -> None:
    code = (
        "import py_compile, sys\nfor f in sys.argv[1:]:\n    py_compile.compile(f, doraise=True)\n"
    )
    files = [str(site / rel) for rel in targets if rel.endswith(".py")]
    if files:
        module.run_command([python, "-c", code, *files], check_rc=True)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "site_packages": {"type": "path", "required": True},
            "patch_dir": {"type": "path", "required": True},
            "patchset_version": {"type": "str", "required": True},
            "python": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "patch_binary": {"type": "str", "default": "patch"},
        },
        supports_check_mode=True,
    )
    params = module.params
    site = Path(params["site_packages"])
    manifest = Path(params["manifest"] or site / "vllm" / ".glm5-patchset.json")
    want = params["patchset_version"]

    vllm_version = installed_vllm_version(site)
    if vllm_version is None or vllm_version != want:
        module.fail_json(
            msg=(
                f"installed vLLM is {vllm_version or 'absent'} in {site}, but the "
                f"patch set is made for vLLM {want}; nothing was changed"
            ),
            vllm_version=vllm_version,
        )
        return

    patch_dir = Path(params["patch_dir"]).resolve()
    if module.check_mode and not patch_dir.is_dir():
        # check mode on a fresh host: the copy task has not created it yet
        module.exit_json(changed=True, vllm_version=vllm_version, applied=[], files={})
    patches = list_patches(patch_dir)
    if not patches:
        module.fail_json(msg=f"no NNNN-*.patch files in {params['patch_dir']}")
    patchset = PatchSet(module, site, patches)
    done = patchset.applied()
    result: dict[str, Any] = {
        "changed": False,
        "vllm_version": vllm_version,
        "manifest": str(manifest),
        "applied": [],
    }

    if params["state"] == "present":
        todo = [p for p in patches if p not in done]
        if todo:
            staging, _ = patchset.stage(todo, reverse=False)
            result.update(changed=True, applied=[p.name for p in todo])
            if module.check_mode:
                shutil.rmtree(staging)
                module.exit_json(**result)
            patchset.install(staging, sorted({t for p in todo for t in patch_targets(p)}))
        data = manifest_data(site, patches, want, vllm_version)
        if todo:
            byte_compile(module, params["python"], site, list(data["files"]))
        if read_manifest(manifest) != data:
            result["changed"] = True
            if not module.check_mode:
                write_manifest(manifest, data)
        result["files"] = data["files"]
        module.exit_json(**result)

    # state == absent: reverse what is applied, newest first
    undo = list(reversed(done))
    if undo:
        staging, targets = patchset.stage(undo, reverse=True)
        result.update(changed=True, applied=[p.name for p in undo])
        if module.check_mode:
            shutil.rmtree(staging)
        else:
            patchset.install(staging, targets)
            byte_compile(module, params["python"], site, targets)
    if manifest.exists():
        result["changed"] = True
        if not module.check_mode:
            manifest.unlink()
    result["files"] = {}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
