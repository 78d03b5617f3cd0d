"""A GGUF shard with one byte flipped, its size and mtime put back: the verification
must hash it again and refuse it (the stat cache keys on ctime and inode too)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _verify(root: Path, manifest: Path, state: Path) -> subprocess.CompletedProcess[str]:
    args = f"root={root} manifest={manifest} stamp={state}"
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-o",
         "-e", f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}",
         "-M", str(ROOT / "roles" / "model" / "library"), "-m", "glm5_model_verify", "-a", args],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120)


def test_flipped_byte_with_size_and_mtime_put_back_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "gguf" / "GLM-5-UD-Q4_K_XL-00001-of-00001.gguf"
    shard.parent.mkdir()
    data = bytearray(os.urandom(1 << 16))
    shard.write_bytes(data)
    manifest = tmp_path / "SHA256SUMS"
    manifest.write_text(f"{hashlib.sha256(data).hexdigest()}  gguf/{shard.name}\n")
    state = tmp_path / "verified.json"
    first = _verify(tmp_path, manifest, state)
    assert first.returncode == 0, first.stdout
    before = shard.stat()
    data[1234] ^= 0xFF
    shard.write_bytes(data)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert shard.stat().st_size == before.st_size and shard.stat().st_mtime_ns == before.st_mtime_ns
    again = _verify(tmp_path, manifest, state)
    assert again.returncode != 0, "a shard that differs from the manifest passed the verification: " + again.stdout
    assert f"gguf/{shard.name}" in again.stdout
    assert json.loads(state.read_text())  # the cache of the first run is still there
