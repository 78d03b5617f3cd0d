#!/usr/bin/python
# Copyright: the glm5-deploy authors
# Apache-2.0
"""Apply, verify, repair or reverse the GLM-5 vLLM patch set, all or nothing."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: glm5_vllm_patchset
short_description: Apply, verify, repair or reverse the GLM-5 vLLM patch set, all or nothing
description:
  - Refuses, naming both versions, when the installed vLLM is not the version the
    patch set was made for; nothing is touched then.
  - What each patched file must hold is computed, never read from the tree: the
    wheel's own file (its sha256 from the installed distribution's RECORD) with the
    patches applied in order. The manifest records that, so it can never vouch for an
    edited file.
  - The wheel's file is recovered from the tree (the file itself, or the file with its
    patches reversed, whichever has the RECORD digest); a file that is neither (edited,
    truncated, missing) is taken from I(sources) (a uv cache, an offline bundle's
    wheels, an unpacked wheel) after its digest was checked against the RECORD there
    and here. When no source has it the module fails naming the file; nothing changed.
  - A file the set adds (a diff from /dev/null) has no wheel's file: it is written from
    the patches alone, and removed by I(state=absent).
  - The other files of the vLLM package are checked against the RECORD too
    (I(verify)) and restored the same way.
  - Every file is written to a temporary name, synced and renamed over the old one, so
    a run killed at any point leaves each file either old or new; the manifest is
    written last. A rerun converges from any such state.
  - Patched files are byte-compiled with the venv's Python.
  - I(state=absent) puts the wheel's files back and removes the manifest.
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
  sources:
    description: Where the wheel's original files are looked for when the tree no
      longer has them, in order. A directory is searched as a uv cache
      (C(archive-v*/*/vllm-<version>.dist-info)), as an unpacked wheel
      (C(vllm-<version>.dist-info) in it) and for C(vllm-<version>-*.whl) files; a
      file is read as a wheel. Missing paths are skipped.
    type: list
    elements: path
    default: []
  verify:
    description: The files of the vLLM package checked besides the patched ones.
      C(patched) none; C(python) every file's size and every C(.py) file's sha256;
      C(all) every file's sha256.
    type: str
    choices: [patched, python, all]
    default: python
  remedy:
    description: Sentence appended to the refusal when an original cannot be found.
    type: str
    default: ""
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
  description: Patches applied (present) or reversed (absent) to some file by this run.
  type: list
  elements: str
  returned: success
repaired:
  description: Files (relative to site-packages) that differed from what the wheel and
    the patch set make them and were restored from a source (or would be, in check mode).
  type: list
  elements: str
  returned: success
files:
  description: Patched files (relative to site-packages) and the sha256 they must have.
  type: dict
  returned: success
manifest:
  description: The manifest path.
  type: str
  returned: success
"""


_PATCH_NAME = re.compile(r"^\d{4}-[A-Za-z0-9._-]+\.patch$")
_TARGET = re.compile(r"^\+\+\+ [^/\s]+/(\S+)", re.MULTILINE)
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# A temporary file this module writes next to the file it replaces.
_NEW_SUFFIX = ".glm5-new"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def installed_vllm_version(site_packages: Path) -> str | None:
    """Version from the vllm-*.dist-info METADATA, None when not installed."""
    dist = installed_dist(site_packages)
    return None if dist is None else dist[1]


def installed_dist(site_packages: Path) -> tuple[Path, str] | None:
    """The vllm-*.dist-info directory and its version, None when not installed."""
    for dist in sorted(site_packages.glob("vllm-*.dist-info")):
        metadata = dist / "METADATA"
        if not metadata.is_file():
            continue
        for line in metadata.read_text(encoding="utf-8").splitlines():
            if line.startswith("Name:") and line.split(":", 1)[1].strip() != "vllm":
                break
            if line.startswith("Version:"):
                return dist, line.split(":", 1)[1].strip()
    return None


def parse_record(text: str) -> dict[str, tuple[str, int]]:
    """A wheel's RECORD: path -> (sha256 hex, size), for the lines that carry a sha256."""
    out: dict[str, tuple[str, int]] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 3 or not row[1].startswith("sha256="):
            continue
        b64 = row[1][len("sha256=") :]
        try:
            digest = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            size = int(row[2]) if row[2] else -1
        except ValueError:
            continue
        out[row[0]] = (digest, size)
    return out


def list_patches(patch_dir: Path) -> list[Path]:
    return sorted(p for p in patch_dir.iterdir() if _PATCH_NAME.match(p.name))


def patch_targets(patch: Path) -> list[str]:
    """Files a unified diff touches, relative to site-packages."""
    return sorted(set(_TARGET.findall(patch.read_text(encoding="utf-8"))))


def split_patch(text: str) -> dict[str, str]:
    """A unified diff cut into one diff per file it touches (headers and hunks, hunks
    read by their line counts), so that each file's patches can be reversed alone."""
    lines = text.splitlines(keepends=True)
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        target = _TARGET.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not (lines[i].startswith("--- ") and target):
            i += 1
            continue
        start = i
        i += 2
        while i < len(lines) and (hunk := _HUNK.match(lines[i])):
            old = int(hunk.group(1) or 1)
            new = int(hunk.group(2) or 1)
            i += 1
            while i < len(lines) and (old > 0 or new > 0 or lines[i].startswith("\\")):
                mark = lines[i][:1]
                if mark in (" ", "\n", "\r"):
                    old, new = old - 1, new - 1
                elif mark == "-":
                    old -= 1
                elif mark == "+":
                    new -= 1
                elif mark != "\\":
                    break
                i += 1
        out[target.group(1)] = out.get(target.group(1), "") + "".join(lines[start:i])
    return out


class Sources:
    """The wheel's original files, from where ml_env installed vLLM: a uv cache, an
    offline bundle's wheels, or an unpacked wheel. A file is taken only when the
    source's own RECORD and the installed RECORD agree on its sha256 and its bytes have
    it."""

    def __init__(self, paths: list[Path], version: str) -> None:
        self.paths = paths
        self.version = version
        self._found: list[tuple[str, dict[str, tuple[str, int]], Any]] | None = None

    def _trees(self) -> Iterator[Path]:
        dist = f"vllm-{self.version}.dist-info"
        for path in self.paths:
            if not path.is_dir():
                continue
            if (path / dist / "RECORD").is_file():
                yield path
            for record in sorted(path.glob(f"archive-v*/*/{dist}/RECORD")):
                yield record.parent.parent

    def _wheels(self) -> Iterator[Path]:
        pattern = f"vllm-{self.version}-*.whl"
        for path in self.paths:
            if path.is_file() and path.match(pattern):
                yield path
            elif path.is_dir():
                yield from sorted(path.glob(pattern))

    def found(self) -> list[tuple[str, dict[str, tuple[str, int]], Any]]:
        """(label, RECORD, reader) for each source present."""
        if self._found is None:
            self._found = []
            for tree in self._trees():
                record = parse_record(
                    (tree / f"vllm-{self.version}.dist-info" / "RECORD").read_text(encoding="utf-8")
                )
                self._found.append((str(tree), record, lambda rel, t=tree: read_bytes(t / rel)))
            for wheel in self._wheels():
                try:
                    archive = zipfile.ZipFile(wheel)
                    record = parse_record(
                        archive.read(f"vllm-{self.version}.dist-info/RECORD").decode("utf-8")
                    )
                except (OSError, KeyError, zipfile.BadZipFile):
                    continue
                self._found.append((str(wheel), record, lambda rel, a=archive: _zip_read(a, rel)))
        return self._found

    def original(self, rel: str, digest: str) -> bytes | None:
        for _label, record, reader in self.found():
            if record.get(rel, ("", 0))[0] != digest:
                continue
            data = reader(rel)
            if data is not None and sha256_bytes(data) == digest:
                return bytes(data)
        return None


def _zip_read(archive: zipfile.ZipFile, rel: str) -> bytes | None:
    try:
        return archive.read(rel)
    except (KeyError, OSError, zipfile.BadZipFile):
        return None


class Tree:
    """The patch set against one site-packages tree."""

    def __init__(self, module: AnsibleModule, site: Path, patches: list[Path]) -> None:
        self.module = module
        self.site = site
        self.patches = patches
        self.patch_binary = module.get_bin_path(module.params["patch_binary"], True)
        # Per file: the patches touching it, in order, each with its own part of the diff.
        self.parts: dict[str, list[tuple[str, str]]] = {}
        for patch in patches:
            for rel, text in split_patch(patch.read_text(encoding="utf-8")).items():
                self.parts.setdefault(rel, []).append((patch.name, text))
        self.targets = sorted(self.parts)
        # Files the set adds (their first diff is from /dev/null): not in the wheel.
        self.created = {rel for rel, parts in self.parts.items() if parts[0][1].startswith("--- /dev/null")}

    def run_patch(self, root: Path, text: str, *, reverse: bool) -> bool:
        cmd = [self.patch_binary, "-p1", "-s", "-f", "-N", "--no-backup-if-mismatch", "-d", str(root)]
        if reverse:
            cmd.insert(1, "-R")
        rc, _out, _err = self.module.run_command(cmd, data=text, binary_data=True)
        return bool(rc == 0)

    def reversed_to(self, rel: str, data: bytes, count: int) -> bytes | None:
        """data with the first count patches of rel reversed, newest first (b"" when
        that removed the file); None when one of them does not reverse."""
        staging = Path(tempfile.mkdtemp(prefix="glm5-patchset-"))
        try:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
            for _name, text in reversed(self.parts[rel][:count]):
                if not self.run_patch(staging, text, reverse=True):
                    return None
            return (staging / rel).read_bytes() if (staging / rel).exists() else b""
        finally:
            shutil.rmtree(staging)

    def recover(self, record: dict[str, tuple[str, int]]) -> dict[str, tuple[bytes | None, int]]:
        """The wheel's bytes of each patched file the tree still has them for, and how
        many of the file's patches the tree has: the file itself when it has the RECORD
        digest (none), else the file with its patches reversed. First all patches on
        all such files at once (one patch run a patch: the usual converged tree), then,
        for a file that did not come back, each shorter prefix of its own patches alone
        (a run killed half-way, an older patch set). The RECORD digest decides, so a
        reverse that applied with fuzz to an edited file is never taken. A file the set
        adds has no wheel's bytes (None): absent, or removed by reversing its patches."""
        disk = {rel: read_bytes(self.site / rel) for rel in self.targets}
        out: dict[str, tuple[bytes | None, int]] = {}
        for rel in sorted(self.created):
            data = disk[rel]
            if data is None:
                out[rel] = (None, 0)
                continue
            for k in range(len(self.parts[rel]), 0, -1):
                if self.reversed_to(rel, data, k) == b"":
                    out[rel] = (None, k)
                    break
        for rel, data in disk.items():
            if rel not in self.created and data is not None and sha256_bytes(data) == record[rel][0]:
                out[rel] = (data, 0)
        todo = [rel for rel, data in disk.items() if data is not None and rel not in out and rel not in self.created]
        if not todo:
            return out
        staging = Path(tempfile.mkdtemp(prefix="glm5-patchset-"))
        try:
            for rel in todo:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_bytes(disk[rel] or b"")
            for patch in reversed(self.patches):
                self.run_patch(staging, patch.read_text(encoding="utf-8"), reverse=True)
            for rel in todo:
                data = (staging / rel).read_bytes()
                if sha256_bytes(data) == record[rel][0]:
                    out[rel] = (data, len(self.parts[rel]))
        finally:
            shutil.rmtree(staging)
        for rel in todo:
            for k in range(len(self.parts[rel]) - 1, 0, -1):
                if rel in out:
                    break
                candidate = self.reversed_to(rel, disk[rel] or b"", k)
                if candidate is not None and sha256_bytes(candidate) == record[rel][0]:
                    out[rel] = (candidate, k)
        return out

    def patched(self, pristine: dict[str, bytes | None]) -> dict[str, bytes]:
        """The wheel's files with every patch applied in order (on a staging copy);
        fails naming the patch that does not apply, nothing touched."""
        staging = Path(tempfile.mkdtemp(prefix="glm5-patchset-"))
        try:
            for rel in self.targets:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                original = pristine[rel]
                if original is not None:
                    (staging / rel).write_bytes(original)
            for patch in self.patches:
                if not self.run_patch(staging, patch.read_text(encoding="utf-8"), reverse=False):
                    self.module.fail_json(
                        msg=(
                            f"{patch.name} does not apply to the files of the vLLM wheel "
                            f"(checked against its RECORD); nothing was changed"
                        )
                    )
            return {rel: (staging / rel).read_bytes() for rel in self.targets}
        finally:
            shutil.rmtree(staging)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Replace path with data: a temporary file beside it, synced, renamed over it."""
    tmp = path.with_name(f".{path.name}{_NEW_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fchmod(handle.fileno(), mode)
        os.fsync(handle.fileno())
    tmp.replace(path)


def sync_dirs(paths: set[Path]) -> None:
    for directory in sorted(paths):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def stale_temporaries(site: Path, rels: list[str], manifest: Path) -> list[Path]:
    """Temporary files a killed run left beside the files this module writes."""
    paths = [site / rel for rel in rels] + [manifest]
    found = [p.with_name(f".{p.name}{_NEW_SUFFIX}") for p in paths]
    found.append(manifest.with_name(f".{manifest.name}.new"))  # an older module's name
    return [p for p in found if p.is_file() or p.is_symlink()]


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def manifest_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


# Run by the venv's Python (its bytecode version and cache tag): prints the files whose
# cached bytecode does not match the source (missing, another Python's, older than the
# source: a run killed before it compiled what it wrote), and compiles them unless "list".
_STALE_BYTECODE = """
import importlib.util, os, py_compile, sys
for path in sys.argv[2:]:
    st = os.stat(path)
    try:
        with open(importlib.util.cache_from_source(path), "rb") as handle:
            head = handle.read(16)
    except OSError:
        head = b""
    flags = int.from_bytes(head[4:8], "little")
    if flags & 1:
        with open(path, "rb") as handle:
            fresh = head[8:16] == importlib.util.source_hash(handle.read())
    else:
        fresh = (head[8:12] == (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                 and head[12:16] == (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    if head[:4] != importlib.util.MAGIC_NUMBER or not fresh:
        print(path)
        if sys.argv[1] == "compile":
            py_compile.compile(path, doraise=True)
"""


def byte_compile(module: AnsibleModule, python: str, site: Path, rels: list[str], *, dry: bool) -> list[str]:
    """Compile the files among rels whose bytecode is stale (all of them, once written);
    the ones that were (would be, when dry) compiled."""
    files = [str(site / rel) for rel in rels if rel.endswith(".py") and (site / rel).is_file()]
    if not files:
        return []
    _rc, out, _err = module.run_command(
        [python, "-c", _STALE_BYTECODE, "list" if dry else "compile", *files], check_rc=True
    )
    return [str(Path(line).relative_to(site)) for line in out.splitlines() if line.strip()]


def package_mismatches(site: Path, record: dict[str, tuple[str, int]], skip: set[str], verify: str) -> list[str]:
    """Files of the vllm package (not in skip) that differ from the RECORD."""
    if verify == "patched":
        return []
    bad = []
    for rel, (digest, size) in record.items():
        if not rel.startswith("vllm/") or rel in skip:
            continue
        path = site / rel
        try:
            st = path.lstat()
        except OSError:
            bad.append(rel)
            continue
        wrong_kind = not path.is_file() or path.is_symlink()
        if wrong_kind or (size >= 0 and st.st_size != size):
            bad.append(rel)
            continue
        if (verify == "all" or rel.endswith(".py")) and sha256_file(path) != digest:
            bad.append(rel)
    return sorted(bad)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "site_packages": {"type": "path", "required": True},
            "patch_dir": {"type": "path", "required": True},
            "patchset_version": {"type": "str", "required": True},
            "python": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "sources": {"type": "list", "elements": "path", "default": []},
            "verify": {"type": "str", "choices": ["patched", "python", "all"], "default": "python"},
            "remedy": {"type": "str", "default": ""},
            "patch_binary": {"type": "str", "default": "patch"},
        },
        supports_check_mode=True,
    )
    params = module.params
    site = Path(params["site_packages"])
    manifest = Path(params["manifest"] or site / "vllm" / ".glm5-patchset.json")
    want = params["patchset_version"]
    present = params["state"] == "present"

    dist = installed_dist(site)
    vllm_version = None if dist is None else dist[1]
    if dist is None or vllm_version != want:
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
        module.exit_json(changed=True, vllm_version=vllm_version, applied=[], repaired=[], files={})
    patches = list_patches(patch_dir)
    if not patches:
        module.fail_json(msg=f"no NNNN-*.patch files in {params['patch_dir']}")
    tree = Tree(module, site, patches)
    record_path = dist[0] / "RECORD"
    try:
        record = parse_record(record_path.read_text(encoding="utf-8"))
    except OSError as exc:
        module.fail_json(msg=f"cannot read vLLM's RECORD {record_path}: {exc}; nothing was changed")
        return
    missing = [rel for rel in tree.targets if rel not in record and rel not in tree.created]
    if missing:
        module.fail_json(
            msg=f"{', '.join(missing)} not in {record_path} (the files the patch set changes "
            f"must come from the vLLM wheel); nothing was changed"
        )
    sources = Sources([Path(p) for p in params["sources"]], want)

    # The wheel's own bytes of every patched file: from the tree where it still has
    # them (itself or its patches reversed), else from a source.
    pristine: dict[str, bytes | None] = {}
    has: dict[str, int] = {}
    repaired: list[str] = []
    unobtainable: list[str] = []
    recovered = tree.recover(record)
    for rel in tree.targets:
        if rel in recovered:
            pristine[rel], has[rel] = recovered[rel]
            continue
        if rel in tree.created:
            # Neither absent nor what the set makes it: written again from the set itself.
            pristine[rel], has[rel] = None, 0
            repaired.append(rel)
            continue
        original = sources.original(rel, record[rel][0])
        if original is None:
            unobtainable.append(rel)
        else:
            pristine[rel], has[rel] = original, 0
            repaired.append(rel)
    # The rest of the package against the RECORD.
    restore: dict[str, bytes] = {}
    for rel in package_mismatches(site, record, set(tree.targets), params["verify"]):
        original = sources.original(rel, record[rel][0])
        if original is None:
            unobtainable.append(rel)
        else:
            restore[rel] = original
            repaired.append(rel)
    if unobtainable:
        where = ", ".join(params["sources"]) or "none given"
        lines = [
            f"{site / rel} "
            + (
                "is missing"
                if read_bytes(site / rel) is None
                else f"differs from vLLM {want}'s wheel"
                + (" and from the wheel with the patch set" if rel in tree.parts else "")
            )
            + f" (RECORD sha256 {record[rel][0]}), and no source holds the original (looked in: {where}); "
            + "nothing was changed."
            + (f" {params['remedy']}" if params["remedy"] else "")
            for rel in sorted(unobtainable)
        ]
        module.fail_json(msg="\n".join(lines), unobtainable=sorted(unobtainable))

    # What each file must hold: bytes, or None for a file that must not exist (a file
    # the set adds, when the set is reversed).
    want_files: dict[str, bytes | None] = dict(tree.patched(pristine)) if present else pristine
    files = {rel: sha256_bytes(content) for rel, content in want_files.items() if content is not None}
    data = {
        "patchset_version": want,
        "vllm_version": vllm_version,
        "patches": {p.name: sha256_file(p) for p in patches},
        # The wheel's digest of each patched file (null: a file the set adds).
        "pristine": {rel: record[rel][0] if rel in record else None for rel in tree.targets},
        "files": files,
    }
    writes: dict[str, bytes | None] = dict(restore)
    for rel in tree.targets:
        current = read_bytes(site / rel)
        target = want_files[rel]
        if target is None:
            if current is not None or (site / rel).is_symlink():
                writes[rel] = None
        elif current != target:
            writes[rel] = target
    # The patches this run applies (present) or reverses (absent) in some file.
    touched: set[str] = set()
    for rel in tree.targets:
        if rel in writes:
            names = [name for name, _text in tree.parts[rel]]
            touched.update(names[has[rel] :] if present else names[: has[rel]])
    # Bytecode of the patched files the tree keeps (written ones are compiled anyway).
    stale = byte_compile(module, params["python"], site, [r for r in tree.targets if r not in writes], dry=True)
    write_manifest = present and read_manifest(manifest) != data
    drop_manifest = not present and (manifest.exists() or manifest.is_symlink())
    leftovers = stale_temporaries(site, tree.targets, manifest)
    result: dict[str, Any] = {
        "changed": bool(writes or stale or write_manifest or drop_manifest or leftovers),
        "vllm_version": vllm_version,
        "manifest": str(manifest),
        "applied": [p.name for p in patches if p.name in touched],
        "repaired": sorted(repaired),
        "files": files if present else {},
    }
    if module.check_mode:
        module.exit_json(**result)

    for path in leftovers:
        path.unlink()
    for rel, content in sorted(writes.items()):
        path = site / rel
        if content is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o7777 if path.is_file() else 0o644
        write_file(path, content, mode)
    sync_dirs({(site / rel).parent for rel in writes})
    # What was written is read back: the tree must now be exactly what was computed.
    wrong = [rel for rel, content in writes.items() if read_bytes(site / rel) != content]
    if wrong:
        module.fail_json(msg=f"{', '.join(sorted(wrong))} in {site} did not keep what was written", **result)
    if writes or stale:
        byte_compile(module, params["python"], site, sorted(set(writes) | set(stale)), dry=False)
    if write_manifest:
        write_file(manifest, manifest_bytes(data), 0o644)
        sync_dirs({manifest.parent})
    if drop_manifest:
        manifest.unlink()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
