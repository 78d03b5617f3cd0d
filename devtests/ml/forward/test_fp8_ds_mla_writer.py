"""Stage 8's CPU writer of vLLM's fp8_ds_mla latent cache, byte for byte.

With ``--kv-cache-dtype fp8`` the sparse backend (patch 0013) reads the latent cache in
the layout vLLM's CUDA op ``concat_and_cache_mla`` writes; on the CPU stage 8 writes it
with glm5_tools.diagnostics.fp8_ds_mla (the stand-in for that op). Its bytes must be the
GPU writer's:

* against the bytes vLLM's own writer wrote on the GPU validation machine for the fixed
  input ``probe_input()`` (tools/gpu/record_fp8_writer.py; gpu_records/ beside this file);
  skipped, with the command that records them, until they are committed;
* without a GPU: every byte against the format's definition, computed here independently
  (nearest-even e4m3 from the table of its 127 non-negative values, the scales, the rope
  bits), and against the torch writer of devtests/ml/patches/sparse_fp8_check.py, whose
  bytes the H100 run found equal to vLLM's writer on its random input
  (docs/validation/e2e-gpu/fp8/README.md, "vLLM's writer matches": fraction 1.0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_tools.diagnostics import fp8_ds_mla

REPO = Path(__file__).resolve().parents[3]
RECORDED = Path(__file__).resolve().parent / "gpu_records"
RECORD_CMD = ("PYTHONPATH=src python3 tools/gpu/record_fp8_writer.py <dir with vLLM 0.20.2's "
              "_C.abi3.so> $OUT")


def _written() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_c, k_pe, slots, shape = fp8_ds_mla.probe_input()
    cache = torch.zeros(shape, dtype=torch.uint8)
    fp8_ds_mla.write(kv_c, k_pe, cache, slots)
    return kv_c, k_pe, slots, cache


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    rows = np.nonzero((got != want).any(-1))[0]
    if rows.size == 0:
        return "equal"
    r = int(rows[0])
    col = int(np.nonzero(got[r] != want[r])[0][0])
    field = "latent" if col < 512 else "scales" if col < 528 else "rope"
    return f"{rows.size} rows differ; first: slot {r}, byte {col} ({field}): CPU {got[r, col]}, GPU {want[r, col]}"


def test_cpu_writer_equals_the_bytes_vllms_gpu_writer_recorded():
    bin_path, meta_path = RECORDED / "fp8_ds_mla_writer.bin", RECORDED / "fp8_ds_mla_writer.json"
    if not bin_path.exists():
        pytest.skip(f"vLLM's GPU writer's bytes are not recorded yet (GPU only): {RECORD_CMD}, then commit "
                    f"$OUT/fp8_ds_mla_writer.{{bin,json}} under {RECORDED.relative_to(REPO)}/")
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_fp8_writer", REPO / "tools" / "gpu" / "record_fp8_writer.py")
    assert spec is not None and spec.loader is not None
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    meta = json.loads(meta_path.read_text())
    kv_c, k_pe, slots, cache = _written()
    assert meta["input_sha256"] == record.input_digest(kv_c, k_pe, slots), "the recording is of another input"
    assert meta["cache_shape"] == list(cache.shape)
    want = np.frombuffer(bin_path.read_bytes(), dtype=np.uint8).reshape(-1, cache.shape[-1])
    got = cache.view(-1, cache.shape[-1]).numpy()
    assert _first_difference(got, want) == "equal"


def _e4m3_nearest_even(y: np.ndarray) -> np.ndarray:
    """Codes of the e4m3 (fn) values nearest to y, ties to the even code, saturating at 448:
    from the table of its values, independently of torch's conversion."""
    codes = np.arange(127, dtype=np.uint8)
    table = codes.view(np.uint8).astype(np.int32)
    exp, man = table >> 3, table & 7
    values = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    a = np.minimum(np.abs(y).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(values, a), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - values[lo], values[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | (np.signbit(y) * 128)).astype(np.uint8)


def test_cpu_writer_bytes_follow_the_layout_definition():
    kv_c, k_pe, slots, cache = _written()
    rows = cache.view(-1, cache.shape[-1]).numpy()
    assert rows.shape[1] == 656
    keep = (slots >= 0).numpy()
    written = rows[slots[slots >= 0].numpy()]
    x = kv_c.float().numpy()[keep].reshape(-1, 4, 128)
    scale = np.maximum(np.abs(x).max(-1) / np.float32(448.0), np.finfo(np.float32).tiny).astype(np.float32)
    assert np.array_equal(written[:, 512:528].view(np.float32), scale)
    y = (x / scale[..., None]).astype(np.float32)
    assert np.array_equal(written[:, :512], _e4m3_nearest_even(y).reshape(-1, 512))
    assert np.array_equal(written[:, 528:].view(np.uint16), k_pe.view(torch.int16).numpy()[keep].view(np.uint16))
    # slots no token was written to (padding tokens included) stay zero
    untouched = np.ones(rows.shape[0], dtype=bool)
    untouched[slots[slots >= 0].numpy()] = False
    assert not rows[untouched].any()
    # the corners are in the input: a scale of FLT_MIN, e4m3 ties resolved to even, subnormals, -0
    assert (written[:, 512:528].view(np.float32) == np.finfo(np.float32).tiny).any()
    assert (written[:, :512] == 0x80).any() and ((written[:, :512] & 0x78) == 0).sum() > 100


def test_cpu_writer_equals_the_torch_writer_the_h100_run_found_equal_to_vllms():
    from sparse_fp8_check import write_fp8_ds_mla

    kv_c, k_pe, slots, cache = _written()
    theirs = torch.zeros_like(cache)
    write_fp8_ds_mla(kv_c, k_pe, theirs, slots)
    assert _first_difference(cache.view(-1, 656).numpy(), theirs.view(-1, 656).numpy()) == "equal"


def test_the_layout_is_the_patched_backends():
    from vllm.v1.attention.backends.mla.sparse_utils import fp8_ds_mla_row_bytes
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLASparseBackend

    assert fp8_ds_mla.row_bytes() == fp8_ds_mla_row_bytes(512, 64) == 656
    assert TritonMLASparseBackend.get_kv_cache_shape(3, 64, 1, 576, "fp8_ds_mla") == (3, 64, 656)
    with pytest.raises(ValueError, match="16-bit inputs only"):
        fp8_ds_mla.encode_rows(torch.zeros(1, 512), torch.zeros(1, 64))
