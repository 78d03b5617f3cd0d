"""A small site-packages holding copies of the real pinned vLLM's patched files."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCH_DIR = ROOT / "files" / "patches" / "vllm-0.20.2"
MODULE = ROOT / "roles" / "vllm_patches" / "library" / "glm5_vllm_patchset.py"
INSTALLED = next((ROOT / ".venv-ml" / "lib").glob("python3*/site-packages"), None)
_TARGET = re.compile(r"^\+\+\+ [^/\s]+/(\S+)", re.MULTILINE)


def targets() -> list[str]:
    found: set[str] = set()
    for patch in sorted(PATCH_DIR.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        found.update(_TARGET.findall(patch.read_text(encoding="utf-8")))
    return sorted(found)


def make_site(dest: Path, version: str = "0.20.2") -> Path:
    assert INSTALLED is not None, "needs the ml venv (.venv-ml) with the pinned vLLM"
    for rel in targets():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(INSTALLED / rel, dest / rel)
    dist = dest / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    metadata = (INSTALLED / "vllm-0.20.2.dist-info" / "METADATA").read_text(encoding="utf-8")
    (dist / "METADATA").write_text(metadata.replace("Version: 0.20.2\n", f"Version: {version}\n", 1), encoding="utf-8")
    return dest


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with the sha256 of its content (dirs as 'dir')."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def pristine(site: Path) -> bool:
    assert INSTALLED is not None
    return all((site / rel).read_bytes() == (INSTALLED / rel).read_bytes() for rel in targets())
