"""Patch 0001 (config) and 0004 (dense MLA on Triton MLA) against vLLM 0.20.2's source.

What the plan assumed, checked on the installed code: the sparse MLA backends do
not accept compute capability 12.0, Triton MLA accepts it but refuses the sparse
path, and GLM-5's config always selects the sparse path (index_topk) unless the
patch set is applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import overlay
import pytest
import torch
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import FlashInferMLASparseBackend
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
from vllm.v1.attention.backends.registry import AttentionBackendEnum

# GLM-5's index_topk (config.json); the dense path equals the sparse one up to it.
GLM5_INDEX_TOPK = 2048
SM120 = DeviceCapability(12, 0)


def reasons(backend: type, *, use_sparse: bool) -> list[str]:
    return list(
        backend.validate_configuration(
            head_size=576,
            dtype=torch.bfloat16,
            kv_cache_dtype="auto",
            block_size=None,
            use_mla=True,
            has_sink=False,
            use_sparse=use_sparse,
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=SM120,
            attn_type="decoder",
        )
    )


def test_claims_about_backends_hold() -> None:
    assert "sparse not supported" in reasons(TritonMLABackend, use_sparse=True)
    assert reasons(TritonMLABackend, use_sparse=False) == []
    assert TritonMLABackend.supports_compute_capability(SM120)
    for sparse in (FlashMLASparseBackend, FlashInferMLASparseBackend):
        assert sparse.is_sparse() and not sparse.supports_compute_capability(SM120)


def glm5_config(tmp_path: Path) -> Path:
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "kv_lora_rank": 512,
        "q_lora_rank": 256,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "index_topk": GLM5_INDEX_TOPK,
        "index_n_heads": 4,
        "index_head_dim": 128,
        "vocab_size": 512,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_config_readable_patched(tmp_path: Path) -> None:
    from vllm.transformers_utils.config import get_config

    config = get_config(str(glm5_config(tmp_path)), trust_remote_code=False)
    assert config.model_type == "glm_moe_dsa"
    assert config.index_topk == GLM5_INDEX_TOPK and config.kv_lora_rank == 512


def test_config_unreadable_unpatched(tmp_path: Path) -> None:
    site = overlay.make_overlay(tmp_path / "pristine", [])
    code = (
        "import sys\n"
        "from vllm.transformers_utils.config import get_config\n"
        "get_config(sys.argv[1], trust_remote_code=False)\n"
    )
    proc = overlay.run_in(site, code, str(glm5_config(tmp_path)))
    assert proc.returncode != 0
    assert "glm_moe_dsa" in proc.stderr


def vllm_config(backend: AttentionBackendEnum | None, max_model_len: int) -> SimpleNamespace:
    return SimpleNamespace(
        attention_config=SimpleNamespace(backend=backend),
        model_config=SimpleNamespace(max_model_len=max_model_len),
    )


@pytest.mark.parametrize(
    ("model_type", "backend", "dense"),
    [
        ("glm_moe_dsa", AttentionBackendEnum.TRITON_MLA, True),
        ("glm_moe_dsa", None, False),
        ("glm_moe_dsa", AttentionBackendEnum.FLASHMLA_SPARSE, False),
        ("deepseek_v32", AttentionBackendEnum.TRITON_MLA, False),
    ],
)
def test_dense_only_for_glm5_on_triton_mla(model_type: str, backend: AttentionBackendEnum | None, dense: bool) -> None:
    from vllm.model_executor.models import deepseek_v2

    config = SimpleNamespace(model_type=model_type, index_topk=GLM5_INDEX_TOPK)
    assert deepseek_v2._glm_dsa_dense(vllm_config(backend, 2048), config) is dense


def test_unpatched_always_sparse() -> None:
    """As shipped, is_v32 is hasattr(config, "index_topk"): GLM-5 is always sparse."""
    import vllm

    pristine = overlay.INSTALLED / "vllm/model_executor/models/deepseek_v2.py"
    text = pristine.read_text(encoding="utf-8")
    assert "_glm_dsa_dense" not in text
    assert text.count('self.is_v32 = hasattr(config, "index_topk")') == 2
    assert vllm.__version__ == "0.20.2"
