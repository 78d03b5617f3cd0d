"""The sparse context bound of role vllm_service (filter_plugins/vllm_service_context.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "filter_plugins"))

import vllm_service_context as ctx

GLM5 = {"num_hidden_layers": 78, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128,
        "index_topk": 2048, "max_position_embeddings": 202752}
MIB = 1024 * 1024


def test_bytes_per_token_is_the_latent_plus_the_indexer_key():
    assert ctx.kv_bytes_per_token(GLM5) == 78 * (576 * 2 + 132)
    dense_config = {k: v for k, v in GLM5.items() if k != "index_topk"}
    assert ctx.kv_bytes_per_token(dense_config) == 78 * 576 * 2


def test_rtx_pro_6000_tp8_is_bounded_by_the_model():
    r = ctx.sparse_context(GLM5, 400 * 10**9, 97887, 0.92, 8, 6144)
    assert r["bounded_by"] == "model" and r["max_model_len"] == 202752
    assert 370_000 < r["kv_tokens"] < 390_000


def test_a_small_budget_bounds_by_the_kv_cache_in_whole_blocks():
    r = ctx.sparse_context(GLM5, 0, 20480, 1.0, 1, 4096)
    assert r["kv_tokens"] == 16384 * MIB // 100152
    assert r["max_model_len"] == r["kv_tokens"] // 64 * 64 and r["bounded_by"] == "KV cache"


def test_weights_larger_than_the_gpu_leave_nothing():
    r = ctx.sparse_context(GLM5, 400 * 10**9, 97887, 0.92, 4, 6144)
    assert r["kv_tokens"] == 0 and r["max_model_len"] == 0


def test_unknown_gpu_memory_falls_back_to_the_model_limit():
    r = ctx.sparse_context(GLM5, 400 * 10**9, 0, 0.92, 8, 6144)
    assert r["kv_tokens"] is None and r["max_model_len"] == 202752


@pytest.mark.parametrize("missing", ["num_hidden_layers", "kv_lora_rank", "max_position_embeddings"])
def test_a_config_without_a_key_is_refused_by_name(missing):
    with pytest.raises(ValueError, match=missing):
        ctx.sparse_context({k: v for k, v in GLM5.items() if k != missing}, 0, 1000, 0.9, 1, 0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        ctx.sparse_context(GLM5, 0, 1000, 0.9, 0, 0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        ctx.sparse_context(GLM5, 0, 1000, 1.5, 1, 0)


def test_gpu_memory_from_facts_or_csv_lines():
    assert ctx.gpu_memory_mib([{"memory_total": "97887 MiB"}, {"memory_total": "97000 MiB"}]) == 97000
    assert ctx.gpu_memory_mib(["81559 MiB", "81559 MiB"]) == 81559
    assert ctx.gpu_memory_mib([]) == 0 and ctx.gpu_memory_mib(None) == 0
    assert ctx.gpu_memory_mib(["[N/A]"]) == 0


def test_latent_row_follows_the_cache_dtype():
    # bf16/fp16: (512 + 64) x 2; fp8 (patch 0013, vLLM's fp8_ds_mla): 512 e4m3 + 4 fp32
    # scales + 64 bf16 rope
    for dtype in ("auto", "bfloat16", "float16"):
        assert ctx.latent_bytes_per_token(GLM5, dtype) == 1152
    for dtype in ("fp8", "fp8_e4m3"):
        assert ctx.latent_bytes_per_token(GLM5, dtype) == 656
    assert ctx.kv_bytes_per_token(GLM5, "fp8") == 78 * (656 + 132)


def test_an_fp8_cache_holds_more_tokens_in_the_same_budget():
    bf16 = ctx.sparse_context(GLM5, 0, 20480, 1.0, 1, 4096)
    fp8 = ctx.sparse_context(GLM5, 0, 20480, 1.0, 1, 4096, "fp8")
    assert fp8["kv_tokens"] == 16384 * MIB // (78 * (656 + 132))
    assert fp8["latent_bytes_per_token_layer"] == 656 and bf16["latent_bytes_per_token_layer"] == 1152
    assert fp8["kv_tokens"] / bf16["kv_tokens"] == pytest.approx(1284 / 788, rel=1e-3)


@pytest.mark.parametrize("dtype", ["fp8_e5m2", "fp8_ds_mla", "int8", ""])
def test_a_cache_dtype_without_a_sparse_layout_is_refused_by_name(dtype):
    with pytest.raises(ValueError, match=f"kv_cache_dtype '{dtype}'"):
        ctx.sparse_context(GLM5, 0, 1000, 0.9, 1, 0, dtype)
