"""Patch 0011: GLM-5's sparse attention (DSA) on Triton, checked on the CPU.

The kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1; the GPU is the
boundary CI cannot reach: docs/validation/sparse-gpu has the H200 run at
GLM-5's real dims). sparse_kernels_check.py compares them and the indexer op the
model calls with float32 torch on GLM-5's per-rank shapes; the off-by-one
context fault shows those checks can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import overlay
import torch
import warm
from service_request import argcheck_request
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
from vllm.v1.attention.backends.registry import AttentionBackendEnum

HERE = Path(__file__).resolve().parent


def validate(backend: type, capability: DeviceCapability, kv_cache_dtype: str = "auto") -> list[str]:
    return list(
        backend.validate_configuration(
            head_size=576,
            dtype=torch.bfloat16,
            kv_cache_dtype=kv_cache_dtype,
            block_size=64,
            use_mla=True,
            has_sink=False,
            use_sparse=True,
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=capability,
            attn_type="decoder",
        )
    )


def test_triton_sparse_backend_takes_glm5_on_sm120_and_sm90() -> None:
    backend = AttentionBackendEnum.TRITON_MLA_SPARSE.get_class()
    assert backend.get_name() == "TRITON_MLA_SPARSE" and backend.is_sparse()
    for cap in (DeviceCapability(12, 0), DeviceCapability(9, 0)):
        assert validate(backend, cap) == []
    # fp8 / fp8_e4m3 since 0013 (test_triton_sparse_mla_fp8.py); other fp8 forms refused
    assert validate(backend, DeviceCapability(12, 0), "fp8_e5m2") == ["kv_cache_dtype not supported"]
    assert "sparse not supported" in validate(TritonMLABackend, DeviceCapability(12, 0))


def test_without_0011_no_backend_serves_glm5_sparse_on_sm120(tmp_path: Path) -> None:
    site = overlay.make_overlay(tmp_path / "upto0010", [p for p in overlay.patches() if p.name < "0011"])
    code = (
        "import torch\n"
        "from vllm.platforms.interface import DeviceCapability\n"
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
        "print('member', 'TRITON_MLA_SPARSE' in E.__members__)\n"
        "print('TRITON_MLA', not E.TRITON_MLA.get_class().is_sparse())\n"
        "for name in ('FLASHMLA_SPARSE', 'FLASHINFER_MLA_SPARSE'):\n"
        "    print(name, not E[name].get_class().supports_compute_capability(DeviceCapability(12, 0)))\n"
    )
    proc = overlay.run_in(site, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert "member False" in lines
    for name in ("TRITON_MLA", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"):
        assert f"{name} True" in lines  # refused: no sparse MLA backend for SM 12.0


def test_indexer_takes_the_triton_path_only_with_the_backend() -> None:
    """SparseAttnIndexer (and the indexer metadata builder) decide by this: the
    Triton indexer exactly when TRITON_MLA_SPARSE is the configured backend."""
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.backends.mla import indexer
    from vllm.v1.attention.backends.mla.sparse_utils import uses_triton_sparse_mla

    def config(backend: object) -> SimpleNamespace:
        return SimpleNamespace(attention_config=SimpleNamespace(backend=backend))

    assert uses_triton_sparse_mla(config(AttentionBackendEnum.TRITON_MLA_SPARSE))
    assert uses_triton_sparse_mla(config("TRITON_MLA_SPARSE"))
    for other in (AttentionBackendEnum.FLASHMLA_SPARSE, AttentionBackendEnum.TRITON_MLA, None):
        assert not uses_triton_sparse_mla(config(other))
    assert sai.uses_triton_sparse_mla is uses_triton_sparse_mla
    assert indexer.uses_triton_sparse_mla is uses_triton_sparse_mla
    assert hasattr(torch.ops.vllm, "sparse_attn_indexer_triton")
    # a splitting op of piecewise CUDA graphs, as vLLM's own indexer op is: its
    # prefill path depends on per-batch metadata
    from vllm.config.compilation import CompilationConfig

    assert "vllm::sparse_attn_indexer_triton" in CompilationConfig._attention_ops


def run_check(*args: str) -> dict[str, object]:
    import conftest

    return overlay.run_interpreted(conftest.PATCHED_SITE, "sparse_kernels_check.py", *args)


def test_kernels_and_indexer_op_match_float32() -> None:
    r = run_check()
    assert r["logits_rel_err"] < 1e-4
    assert r["logits_causal"] is True
    assert r["topk_agreement"] == 1.0
    assert r["topk_causal_and_counts"] is True
    assert r["sparse_mla_rel_err"] < 0.02
    assert r["empty_rows_zero"] is True
    assert r["splits_used"] == [1, 2]  # both the one-split and the merged path ran
    # once-per-step token metadata (request, context; padding tokens context 0)
    assert r["token_meta_ok"] is True
    assert r["padding_rows_empty"] is True
    # top-k: the torch path here (vLLM's CUDA kernels: docs/validation/sparse-gpu)
    assert r["topk_path_cpu"] == "torch"
    assert r["topk_exact_vs_float32"] is True
    assert r["topk_ties_earliest"] is True


def test_off_by_one_context_is_caught() -> None:
    r = run_check("--fault", "off-by-one")
    assert r["logits_causal"] is False
    assert r["topk_causal_and_counts"] is False
    assert r["topk_agreement"] < 1.0


ROOT = HERE.parents[2]


def _sparse_request(tmp_path: Path, **extra: object) -> dict[str, object]:
    """The role's argcheck request with its defaults (sparse attention)."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    facts = {
        "model_gguf_path": str(tmp_path / "GLM-5-UD-Q4_K_XL-00001-of-00010.gguf"),
        "model_tokenizer_dir": str(base),
        "model_config_dir": str(base),
        **extra,
    }
    return argcheck_request(facts)


def _argcheck(request: dict[str, object]) -> subprocess.CompletedProcess[str]:
    import conftest

    env = {
        **os.environ,
        "GLM5_ARGCHECK_PLATFORM": "cuda",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "PYTHONPATH": str(conftest.PATCHED_SITE),
    }
    return warm.run([sys.executable, str(ROOT / "roles/vllm_service/files/vllm_argcheck.py"), json.dumps(request)],
                    env=env, timeout=300)


def test_service_default_is_sparse_and_parses_on_the_patched_tree(tmp_path: Path) -> None:
    request = _sparse_request(tmp_path)
    assert request["sparse"] is True and request["max_model_len_cap"] is None
    args = request["role_args"]
    assert args[args.index("--attention-backend") + 1] == "TRITON_MLA_SPARSE"
    # before validate.yml bounds it: the model's own limit (GLM-5's max_position_embeddings)
    assert args[args.index("--max-model-len") + 1] == "202752"
    proc = _argcheck(request)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed["attention_backend"] == "TRITON_MLA_SPARSE" and parsed["max_model_len"] == 202752


def test_sparse_service_refuses_a_kv_cache_dtype_in_extra_args(tmp_path: Path) -> None:
    # the role sets it (vllm_service_kv_cache_dtype; fp8 since 0013: test_triton_sparse_mla_fp8.py)
    proc = _argcheck(_sparse_request(tmp_path, vllm_service_extra_args=["--kv-cache-dtype", "fp8"]))
    assert proc.returncode == 2
    assert "--kv-cache-dtype" in proc.stderr and "vllm_service_kv_cache_dtype" in proc.stderr
