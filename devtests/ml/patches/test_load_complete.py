"""Patch 0009: a GGUF whose weights do not all arrive fails the load loudly.

Failing test first: without 0009, vLLM 0.20.2 with 0001-0008
(a) finishes the weight iterators without a word when a layer's attn_v_b (or
attn_k_b) never came, so kv_b_proj, which 0003 rebuilds from the pair, stays
uninitialised memory; (b) drops a missing file of a split GGUF from the shard list
(GGUFModelLoader._get_all_gguf_files only keeps the files it finds), so every tensor
of that shard stays uninitialised. Both tests failed there (no exception raised).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from vllm.model_executor.model_loader import weight_utils
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

HEADS, LORA, NOPE, V = 2, 32, 16, 16
K_B = "model.layers.0.self_attn.kv_b_proj.weight"


def _write(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "glm-dsa")
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _k_b() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((HEADS, LORA, NOPE)).astype(np.float32)


def _v_b() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((HEADS, V, LORA)).astype(np.float32)


NAME_MAP = {"blk.0.attn_k_b.weight": K_B, "blk.0.attn_v_b.weight": K_B}


def test_both_halves_rebuild_kv_b(tmp_path: Path):
    f = _write(tmp_path / "m.gguf", {"blk.0.attn_k_b.weight": _k_b(), "blk.0.attn_v_b.weight": _v_b()})
    items = list(weight_utils.gguf_quant_weights_iterator(str(f), NAME_MAP))
    assert [n for n, _ in items] == [K_B]
    assert tuple(items[0][1].shape) == (HEADS * (NOPE + V), LORA)


@pytest.mark.parametrize("present", ["attn_k_b", "attn_v_b"])
def test_a_missing_kv_b_half_fails_the_load(tmp_path: Path, present: str):
    data = {"attn_k_b": _k_b(), "attn_v_b": _v_b()}[present]
    f = _write(tmp_path / "m.gguf", {f"blk.0.{present}.weight": data})
    missing = "attn_v_b" if present == "attn_k_b" else "attn_k_b"
    with pytest.raises(ValueError, match=f"{K_B}.*{missing}"):
        list(weight_utils.gguf_quant_weights_iterator(str(f), NAME_MAP))


def test_a_missing_kv_b_half_fails_the_split_load(tmp_path: Path):
    a = _write(tmp_path / "m-00001-of-00002.gguf", {"blk.0.attn_k_b.weight": _k_b()})
    b = _write(tmp_path / "m-00002-of-00002.gguf", {"blk.1.attn_q_a.weight": np.zeros((4, 32), np.float32)})
    with pytest.raises(ValueError, match="attn_v_b"):
        list(weight_utils.gguf_quant_weights_iterator_multi([str(a), str(b)], NAME_MAP))


def test_a_missing_file_of_a_split_gguf_fails_the_load(tmp_path: Path):
    first = _write(tmp_path / "m-00001-of-00003.gguf", {"blk.0.attn_k_b.weight": _k_b()})
    _write(tmp_path / "m-00003-of-00003.gguf", {"blk.0.attn_v_b.weight": _v_b()})
    with pytest.raises(FileNotFoundError, match=r"m-00002-of-00003\.gguf"):
        GGUFModelLoader._get_all_gguf_files(str(first))


def test_a_complete_split_gguf_lists_every_file(tmp_path: Path):
    files = [_write(tmp_path / f"m-0000{i}-of-00002.gguf", {f"blk.{i}.x.weight": np.zeros(32, np.float32)})
             for i in (1, 2)]
    assert GGUFModelLoader._get_all_gguf_files(str(files[0])) == [str(f) for f in files]
