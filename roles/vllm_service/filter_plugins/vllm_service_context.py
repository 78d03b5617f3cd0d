"""How long a context GLM-5's sparse attention can serve on this host (role vllm_service).

With sparse attention (TRITON_MLA_SPARSE) GLM-5 is exact at any length, so the service's
max_model_len defaults to the model's own limit (config.json max_position_embeddings),
bounded by what the KV cache of one GPU can hold:

  per-GPU memory for vLLM  = GPU memory x gpu_memory_utilization
  weights per GPU          = GGUF bytes / tensor-parallel size
  KV budget                = memory for vLLM - weights per GPU - reserve
                             (activations, CUDA graphs, the sampler: vLLM measures
                             them at start; the reserve is the role's estimate)
  bytes per token          = layers x (latent row + index_head_dim + 4)
                             (MLA's latent cache is not split by TP: every rank holds
                             all of it; plus the indexer's fp8 key and fp32 scale)
  latent row               = (kv_lora_rank + qk_rope_head_dim) x 2 with a bf16/fp16
                             cache (vllm_service_kv_cache_dtype auto, bfloat16,
                             float16: 1,152 bytes for GLM-5); with fp8 / fp8_e4m3
                             (patch 0013, vLLM's fp8_ds_mla layout) kv_lora_rank e4m3
                             bytes + one fp32 scale per 128 of them + the rope part
                             in bf16: 512 + 16 + 128 = 656 bytes
  KV tokens                = KV budget / bytes per token
  max_model_len            = min(max_position_embeddings, KV tokens), rounded down to
                             the 64-token cache block

vLLM refuses at start a max_model_len its KV cache cannot hold; this computes the same
bound before anything is installed, so a bad combination fails in validate, not after a
400 GB load.
"""

from __future__ import annotations

from typing import Any

BLOCK = 64
MIB = 1024 * 1024
# the latent cache layouts by --kv-cache-dtype: bytes per latent value (16-bit), or
# vLLM's fp8_ds_mla (fp8 values, an fp32 scale per FP8_TILE of them, 16-bit rope)
SIXTEEN_BIT = ("auto", "bfloat16", "float16")
FP8_DS_MLA = ("fp8", "fp8_e4m3")
FP8_TILE = 128


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"config.json has no positive integer {key} (got {value!r})")
    return value


def latent_bytes_per_token(config: dict[str, Any], kv_cache_dtype: str = "auto") -> int:
    """Bytes of one token's MLA latent cache row in one layer for --kv-cache-dtype."""
    lora = _int(config, "kv_lora_rank")
    rope = _int(config, "qk_rope_head_dim")
    if kv_cache_dtype in SIXTEEN_BIT:
        return (lora + rope) * 2
    if kv_cache_dtype in FP8_DS_MLA:
        if lora % FP8_TILE:
            raise ValueError(f"kv_lora_rank {lora} is not a multiple of the fp8 scale tile {FP8_TILE}")
        return lora + 4 * (lora // FP8_TILE) + 2 * rope
    raise ValueError(
        f"kv_cache_dtype {kv_cache_dtype!r}: the sparse path's cache is one of "
        + ", ".join(SIXTEEN_BIT + FP8_DS_MLA)
    )


def kv_bytes_per_token(config: dict[str, Any], kv_cache_dtype: str = "auto") -> int:
    """KV cache bytes per token on each GPU for GLM-5 with sparse attention."""
    layers = _int(config, "num_hidden_layers")
    latent = latent_bytes_per_token(config, kv_cache_dtype)
    indexer = _int(config, "index_head_dim") + 4 if "index_topk" in config else 0
    return layers * (latent + indexer)


def sparse_context(
    config: dict[str, Any],
    gguf_bytes: int,
    gpu_memory_mib: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    reserve_mib: int,
    kv_cache_dtype: str = "auto",
) -> dict[str, Any]:
    """The sparse path's max_model_len and how it was computed.

    gpu_memory_mib 0 means unknown (no GPU query on this host): the model's own limit
    is returned with kv_tokens None, and vLLM's start-up check is the bound."""
    limit = _int(config, "max_position_embeddings")
    per_token = kv_bytes_per_token(config, kv_cache_dtype)
    if tensor_parallel_size <= 0:
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization {gpu_memory_utilization}")
    result: dict[str, Any] = {
        "model_limit": limit,
        "bytes_per_token": per_token,
        "kv_cache_dtype": kv_cache_dtype,
        "latent_bytes_per_token_layer": latent_bytes_per_token(config, kv_cache_dtype),
        "weights_per_gpu_mib": gguf_bytes // tensor_parallel_size // MIB,
    }
    if gpu_memory_mib <= 0:
        result.update(kv_tokens=None, max_model_len=limit, bounded_by="model (GPU memory unknown)")
        return result
    budget = int(gpu_memory_mib * gpu_memory_utilization * MIB) - gguf_bytes // tensor_parallel_size
    budget -= reserve_mib * MIB
    tokens = max(0, budget) // per_token
    length = min(limit, tokens) // BLOCK * BLOCK
    result.update(
        kv_budget_mib=max(0, budget) // MIB,
        kv_tokens=tokens,
        max_model_len=length,
        bounded_by="model" if limit <= tokens else "KV cache",
    )
    return result


def gpu_memory_mib(gpus: list[dict[str, Any]] | list[str] | None) -> int:
    """The smallest memory.total of nvidia-smi's GPUs, 0 if none: role nvidia_driver's
    list of dicts ({'memory_total': '97887 MiB'}) or nvidia-smi's csv lines ('97887 MiB')."""
    sizes = []
    for gpu in gpus or []:
        value = gpu.get("memory_total", "") if isinstance(gpu, dict) else gpu
        raw = str(value).split()
        if raw and raw[0].isdigit():
            sizes.append(int(raw[0]))
    return min(sizes) if sizes else 0


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_service_sparse_context": sparse_context,
            "vllm_service_gpu_memory_mib": gpu_memory_mib,
        }
