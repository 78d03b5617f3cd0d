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


# Files of the package the patch set does not touch, copied too: the module checks
# them against the RECORD (vllm_patches_verify_files).
UNPATCHED = ["vllm/envs.py", "vllm/logger.py", "vllm/py.typed"]


def make_site(dest: Path, version: str = "0.20.2") -> Path:
    """The patched files and a few others, with the dist-info's METADATA and the
    RECORD lines of exactly those files (the wheel's own digests)."""
    assert INSTALLED is not None, "needs the ml venv (.venv-ml) with the pinned vLLM"
    # A file the set adds (0015's gguf_triton.py) is not in the wheel: the patch creates it.
    files = [rel for rel in targets() if (INSTALLED / rel).exists()] + UNPATCHED
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(INSTALLED / rel, dest / rel)
    dist = dest / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    source = INSTALLED / "vllm-0.20.2.dist-info"
    metadata = (source / "METADATA").read_text(encoding="utf-8")
    (dist / "METADATA").write_text(metadata.replace("Version: 0.20.2\n", f"Version: {version}\n", 1), encoding="utf-8")
    lines = [line for line in (source / "RECORD").read_text(encoding="utf-8").splitlines()
             if line.split(",", 1)[0] in files]
    assert len(lines) == len(files), "a file of the site is not in the wheel's RECORD"
    (dist / "RECORD").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with the sha256 of its content (dirs as 'dir')."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def added() -> list[str]:
    """The files the patch set adds (not in the wheel)."""
    assert INSTALLED is not None
    return [rel for rel in targets() if not (INSTALLED / rel).exists()]


def pristine(site: Path) -> bool:
    """The wheel's files, and none of the files the set adds."""
    assert INSTALLED is not None
    return all(
        not (site / rel).exists() if rel in added() else (site / rel).read_bytes() == (INSTALLED / rel).read_bytes()
        for rel in targets()
    )


def originals(dest: Path) -> Path:
    """A source of the wheel's original files laid out as uv's cache keeps an unpacked
    wheel (archive-v0/<id>/ with the package and its dist-info), holding the real
    pinned wheel's files (those of .venv-ml, which uv installed from it)."""
    assert INSTALLED is not None
    tree = dest / "archive-v0" / "test-entry"
    for rel in [*targets(), *UNPATCHED, "vllm-0.20.2.dist-info/RECORD"]:
        if rel in added():
            continue
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(INSTALLED / rel, tree / rel)
    return dest
