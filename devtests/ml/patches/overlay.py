"""Patched and pristine copies of the installed vLLM, for the patch-set tests.

The installed vLLM (.venv-ml) is never modified: an overlay is a tree of symlinks
to it in which only the files the patch set touches are real copies, patched with
the patch tool exactly as the role does it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

import warm

REPO = Path(__file__).resolve().parents[3]
PATCH_DIR = REPO / "files" / "patches" / "vllm-0.20.2"
INSTALLED = Path(sysconfig.get_paths()["purelib"])
_TARGET = re.compile(r"^\+\+\+ [^/\s]+/(\S+)", re.MULTILINE)


def patches() -> list[Path]:
    return sorted(PATCH_DIR.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def targets(only: list[Path] | None = None) -> list[str]:
    found: set[str] = set()
    for patch in only if only is not None else patches():
        found.update(_TARGET.findall(patch.read_text(encoding="utf-8")))
    return sorted(found)


def apply(root: Path, patch: Path, *, reverse: bool = False, dry: bool = False) -> None:
    cmd = ["patch", "-p1", "-s", "-f", "-N", "-d", str(root), "-i", str(patch)]
    if reverse:
        cmd.insert(1, "-R")
    if dry:
        cmd.insert(1, "--dry-run")
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def make_overlay(dest: Path, applied: list[Path]) -> Path:
    """A site dir at dest whose vllm/ is the installed one plus the given patches."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-as", str(INSTALLED / "vllm"), str(dest / "vllm")], check=True)
    # real copies of every file the patch set or the given patches (a fault) change
    for rel in sorted(set(targets()) | set(targets(applied))):
        link = dest / rel
        if not (INSTALLED / rel).exists():
            continue  # a file the patch set adds (0015's gguf_triton.py): the patch creates it
        link.unlink()
        shutil.copy2(INSTALLED / rel, link)
    for patch in applied:
        apply(dest, patch)
    return dest


def overlay_dir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"glm5-vllm-{name}-"))


def run_in(site: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter that imports vllm from site (warm.py starts it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO / "devtests" / "ml" / "patches")])
    return warm.run([sys.executable, "-c", code, *args], env=env)


def run_interpreted(site: Path, script: str, *args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Run one of this folder's check scripts (``script``) in a fresh interpreter that
    imports vllm from ``site``, its Triton kernels under Triton's CPU interpreter (an
    empty CUDA_VISIBLE_DEVICES is vLLM's own case for "Triton usable with no active GPU
    driver"), and return the JSON object the script prints as its last line. ``env``:
    variables to set, or to remove where the value is None."""
    here = REPO / "devtests" / "ml" / "patches"
    full = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    full["PYTHONPATH"] = os.pathsep.join([str(site), str(here)])
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    proc = warm.run([sys.executable, str(here / script), *args], env=full, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
