"""Pure functions of the roles' modules: manifest verification, shard selection."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


def _load(path: str):
    return load_file(ROOT / path)


verify_mod = _load("roles/model/library/glm5_model_verify.py")
layout_mod = _load("roles/model/library/glm5_model_layout.py")


def test_manifest_formats():
    sums = verify_mod.parse_manifest("abc  gguf/a.gguf\n# c\ndef *base/config.json\n")
    assert sums == [{"path": "gguf/a.gguf", "size": None, "sha256": "abc"},
                    {"path": "base/config.json", "size": None, "sha256": "def"}]
    js = verify_mod.parse_manifest(json.dumps([{"path": "x", "size": 3, "sha256": None}]))
    assert js == [{"path": "x", "size": 3, "sha256": None}]


def test_verify_hashes_once_and_detects_corruption(tmp_path):
    f = tmp_path / "a.gguf"
    f.write_bytes(b"hello")
    entries = [{"path": "a.gguf", "size": 5, "sha256": hashlib.sha256(b"hello").hexdigest()}]
    errors, stamp, hashed, total = verify_mod.verify(tmp_path, entries, {})
    assert (errors, hashed, total) == ([], ["a.gguf"], 5)
    errors, stamp2, hashed, _ = verify_mod.verify(tmp_path, entries, stamp)
    assert (errors, hashed, stamp2) == ([], [], stamp)
    f.write_bytes(b"hellx")
    errors, _, _, _ = verify_mod.verify(tmp_path, entries, stamp)
    assert errors and "sha256" in errors[0]
    errors, _, _, _ = verify_mod.verify(tmp_path, [{"path": "../etc/passwd", "size": 1, "sha256": None}], {})
    assert "leaves" in errors[0]


def test_pick_first_shard(tmp_path):
    files = [tmp_path / f"GLM-5-UD-Q4_K_XL-0000{i}-of-00003.gguf" for i in (2, 1, 3)]
    first, shards = layout_mod.pick_gguf(files)
    assert first.name.endswith("-00001-of-00003.gguf") and len(shards) == 3
    with pytest.raises(ValueError, match="shards"):
        layout_mod.pick_gguf(files[:2])
    single = tmp_path / "GLM-5-UD-Q4_K_XL.gguf"
    assert layout_mod.pick_gguf([single])[0] == single
    with pytest.raises(ValueError):
        layout_mod.pick_gguf([])
