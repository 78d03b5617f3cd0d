"""Patch 0013: an fp8 latent cache (vLLM's fp8_ds_mla layout) for TRITON_MLA_SPARSE, on the CPU.

The kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1). vLLM's own
writer of the layout (concat_and_cache_mla, a CUDA op) is the boundary CI
cannot reach: sparse_fp8_check.py writes the rows with this project's torch
writer of the same layout, and docs/validation/e2e-gpu/fp8 runs the same check
on the GPU with vLLM's writer, comparing the bytes. Two fault patches
(faults/fp8-*.patch: a wrong scale index, the rope part read at the scales)
show the checks fail, naming what failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import overlay
import pytest
import warm
from test_triton_sparse_mla import _argcheck, _sparse_request, validate
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum

HERE = Path(__file__).resolve().parent
FAULTS = HERE / "faults"

# the bounds each named check must meet (failed_checks names those that do not)
# e4m3 keeps 3 mantissa bits: a value in the tile's top binade [256, 448) x scale
# is off by at most half its ulp, 16 / 448 of the tile's largest magnitude
HALF_ULP_OF_TILE_MAX = 16 / 448


def failed_checks(r: dict[str, object]) -> list[str]:
    bounds = {
        "row_bytes": r["row_bytes"] == 656,
        "roundtrip_latent_max_err_over_tile_max": float(r["roundtrip_latent_max_err_over_tile_max"])  # type: ignore[arg-type]
        <= HALF_ULP_OF_TILE_MAX * 1.0001,
        "roundtrip_rope_exact": r["roundtrip_rope_exact"] is True,
        # the kernel's own error over the dequantized cache: bf16 operands
        # (the dequantized latent is rounded to bf16 in the loop)
        "fp8_kernel_vs_float32_dequant_rel_err": float(r["fp8_kernel_vs_float32_dequant_rel_err"]) < 0.01,  # type: ignore[arg-type]
        "fp8_kernel_lse_abs_err": float(r["fp8_kernel_lse_abs_err"]) < 2e-3,  # type: ignore[arg-type]
        # the quantization error: fp8 cache against the bf16 cache of the same rows
        "fp8_vs_bf16_cache_rel_err": float(r["fp8_vs_bf16_cache_rel_err"]) < 0.05,  # type: ignore[arg-type]
        "empty_rows_zero": r["empty_rows_zero"] is True,
        "splits_used": r["splits_used"] == [1, 2],
        "cache_shape_fp8": r["cache_shape_fp8"] == [3, 64, 656],
        "cache_shape_bf16": r["cache_shape_bf16"] == [3, 64, 576],
        "wrong_row_bytes_refused": r["wrong_row_bytes_refused"] is True,
        "plain_fp8_cache_refused": r["plain_fp8_cache_refused"] is True,
    }
    return [name for name, ok in bounds.items() if not ok]


def run_check(site: Path) -> dict[str, object]:
    return overlay.run_interpreted(site, "sparse_fp8_check.py")


def test_fp8_cache_kernel_matches_float32_and_the_bf16_cache() -> None:
    import conftest

    r = run_check(conftest.PATCHED_SITE)
    print(json.dumps(r, indent=1))
    assert failed_checks(r) == []
    # the quantization error is larger than the kernel's own: it is what the
    # fp8 cache costs, measured on the served model by docs/validation/e2e-gpu/fp8
    assert float(r["fp8_vs_bf16_cache_rel_err"]) > float(r["bf16_kernel_vs_float32_rel_err"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("fp8-scale-of-next-tile.patch", "fp8_kernel_vs_float32_dequant_rel_err"),
        ("fp8-rope-read-at-scales.patch", "fp8_kernel_vs_float32_dequant_rel_err"),
    ],
)
def test_a_fault_in_the_fp8_kernel_fails_the_check(tmp_path: Path, fault: str, named: str) -> None:
    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), FAULTS / fault])
    r = run_check(site)
    failed = failed_checks(r)
    print(fault, failed, named, r[named])
    assert named in failed, failed
    # the writer and the reader are this test's own: the fault is in the kernel only
    assert "roundtrip_rope_exact" not in failed and "row_bytes" not in failed


def test_backend_takes_fp8_and_fp8_e4m3_only() -> None:
    backend = AttentionBackendEnum.TRITON_MLA_SPARSE.get_class()
    for dtype in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"):
        assert validate(backend, DeviceCapability(12, 0), dtype) == [], dtype
    for dtype in ("fp8_e5m2", "fp8_inc", "nvfp4"):
        assert validate(backend, DeviceCapability(12, 0), dtype) == ["kv_cache_dtype not supported"], dtype


def _argcheck_on(site: Path, request: dict[str, object]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLM5_ARGCHECK_PLATFORM": "cuda", "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONPATH": str(site)}
    checker = HERE.parents[2] / "roles" / "vllm_service" / "files" / "vllm_argcheck.py"
    return warm.run([sys.executable, str(checker), json.dumps(request)], env=env, timeout=300)


def test_sparse_service_takes_an_fp8_cache_with_0013(tmp_path: Path) -> None:
    # fp8_e4m3 is the same cache (the backend list: test_backend_takes_fp8_and_fp8_e4m3_only)
    dtype = "fp8"
    request = _sparse_request(tmp_path, vllm_service_kv_cache_dtype=dtype)
    args = request["role_args"]
    assert isinstance(args, list) and args[args.index("--kv-cache-dtype") + 1] == dtype
    proc = _argcheck(request)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["kv_cache_dtype"] == dtype


def test_the_default_renders_no_kv_cache_dtype(tmp_path: Path) -> None:
    assert "--kv-cache-dtype" not in _sparse_request(tmp_path)["role_args"]  # type: ignore[operator]


def test_sparse_service_refuses_other_quantized_caches(tmp_path: Path) -> None:
    """Past the role's argument spec (which takes auto/bfloat16/float16/fp8/fp8_e4m3
    only): the checker's own refusal, for a request with another cache dtype."""
    dtype = "fp8_e5m2"
    request = _sparse_request(tmp_path)
    request["role_args"] = [*request["role_args"], "--kv-cache-dtype", dtype]  # type: ignore[list-item]
    proc = _argcheck(request)
    assert proc.returncode == 2
    assert f"--kv-cache-dtype {dtype}: TRITON_MLA_SPARSE takes auto, bfloat16, float16, fp8 or fp8_e4m3" in proc.stderr


def test_sparse_service_refuses_fp8_with_mtp(tmp_path: Path) -> None:
    proc = _argcheck(_sparse_request(tmp_path, vllm_service_kv_cache_dtype="fp8", vllm_service_mtp_tokens=2))
    assert proc.returncode == 2
    assert "--kv-cache-dtype fp8 with --speculative-config: the sparse fp8 cache is not checked" in proc.stderr


def test_without_0013_the_backend_and_the_service_refuse_fp8(tmp_path: Path) -> None:
    site = overlay.make_overlay(tmp_path / "upto0012", [p for p in overlay.patches() if p.name < "0013"])
    proc = overlay.run_in(
        site,
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
        "print(E.TRITON_MLA_SPARSE.get_class().supported_kv_cache_dtypes)",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'fp8'" not in proc.stdout and "'bfloat16'" in proc.stdout
    proc = _argcheck_on(site, _sparse_request(tmp_path, vllm_service_kv_cache_dtype="fp8"))
    assert proc.returncode == 2
    assert "keeps a bf16/fp16 MLA cache (the fp8 cache needs patch 0013 of the patch set)" in proc.stderr
