"""Pure functions of the roles' modules: shard selection (the verification:
devtests/model/test_verify.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


def _load(path: str):
    return load_file(ROOT / path)


layout_mod = _load("roles/model/library/glm5_model_layout.py")


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
