"""vLLM's own forward pass of a glm-dsa GGUF on the CPU, one prefill, with per-layer taps.

The model is what ``vllm serve <gguf> --tokenizer <dir> --hf-config-path <dir>
--attention-backend <backend>`` builds (tensor parallel 1): vLLM's config classes, its
GGUF model loader (the patch set's mapping, dequantization and kv_b rebuild), the model
class ``GlmMoeDsaForCausalLM`` (deepseek_v2.py), ``FusedMoE`` with its real router
(grouped top-k, ``e_score_correction_bias``, ``routed_scaling_factor`` applied by the MoE
runner), the MLA attention layer and the attention backend's own implementation:

* ``TRITON_MLA`` (patch 0004's dense path): every prompt token is run as one decode
  request of query length 1 whose context is the prompt up to it, all requests in one
  forward over one shared block table, so the Triton MQA kernel (``decode_attention_fwd``,
  the kernel the service runs for decode tokens) computes causal attention for every
  position in one pass. Prefill tokens take FlashAttention on a GPU (CUDA only, no CPU
  path): that kernel is not covered here (stage 5 checks it on a GPU).
* ``TRITON_MLA_SPARSE`` (patch 0011): one prefill request, as the service runs it; the
  indexer op, its top-k and the sparse MLA kernel are the backend's own.

Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is
imported). Where vLLM has CUDA code only, a CPU stand-in takes its place, named as such:

* the GGUF matmul / MoE / embedding ops (``fused_mul_mat_gguf``, ``fused_moe_gguf``,
  ``apply_gguf_embedding``): gguf-py dequantization of the layer's own loaded bytes and a
  float32 matmul (stage 4's stand-ins, ``stage_layers.cpu_reference_matmul``,
  ``stage_experts.cpu_reference_moe``);
* the indexer's query quantization ``per_token_group_fp8_quant`` (vLLM's Triton fallback
  for it rounds wrongly in Triton's interpreter: ``standin_per_token_group_quant_fp8``);
* the cache writes ``concat_and_cache_mla`` (MLA cache) and ``indexer_k_quant_and_cache``
  (the indexer's fp8 key cache), written from their CUDA kernels' documented layout;
* the GGUF dequantize op used at load time for the kv_b rebuild (``ggml_dequantize``).

Everything else, the router included, is vLLM's Python/Triton code. ``torch.compile`` is
off (``TORCHDYNAMO_DISABLE``): the same Python runs eagerly.
"""

from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

BACKENDS = ("TRITON_MLA", "TRITON_MLA_SPARSE")
KV_CACHE_DTYPES = ("auto", "fp8")  # --kv-cache-dtype: the model's dtype, or fp8_ds_mla (sparse only)
BLOCK = 64  # page size of the MLA and indexer caches (the sparse backend's only one)


def prepare_environment() -> None:
    """Before vLLM or Triton is imported: Triton's interpreter, no torch.compile."""
    import sys

    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("vllm_forward: Triton was imported before Triton's interpreter was switched on; "
                           "call prepare_environment() before importing vllm or triton")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # vLLM disables Triton when no GPU driver is active, except with an empty
    # CUDA_VISIBLE_DEVICES (a distributed worker before CUDA starts): the interpreter
    # needs no driver
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


# --- CPU stand-ins for CUDA-only ops ---------------------------------------------------------

# Dequantized weights of the model's own parameters (kept while the parameter lives);
# temporaries (a merged layer's shard sliced per call) are dequantized every time, never
# cached by address, which a later temporary can reuse.
_DEQUANT_CACHE: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}


def _dequant(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    """gguf-py's dequantization of raw GGUF rows [..., bytes] -> float32 [..., values]."""
    import gguf

    cacheable = isinstance(raw, torch.nn.Parameter)
    if cacheable:
        hit = _DEQUANT_CACHE.get(id(raw))
        if hit is not None and hit[0]() is raw and hit[1] == int(qtype):
            return hit[2]
    arr = raw.detach().cpu().numpy()
    flat = np.ascontiguousarray(arr.reshape(-1, arr.shape[-1]))
    out = gguf.quants.dequantize(flat, gguf.GGMLQuantizationType(int(qtype)))
    got = torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(*arr.shape[:-1], -1))
    if cacheable:
        _DEQUANT_CACHE[id(raw)] = (weakref.ref(raw), int(qtype), got)
    return got


def standin_mul_mat_gguf(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int) -> torch.Tensor:
    """CPU stand-in for vLLM's GGUF matmul op (CUDA only): x @ dequant(W)^T in float32."""
    from vllm.model_executor.layers.quantization.gguf import UNQUANTIZED_TYPES

    if x.shape[0] == 0:
        return torch.empty(0, qweight.shape[0], dtype=x.dtype)
    w = qweight.float() if qweight_type in UNQUANTIZED_TYPES else _dequant(qweight, qweight_type)
    return (x.float() @ w.T).to(x.dtype)


def standin_moe_gguf(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, qtype1: int, qtype2: int, activation: str) -> torch.Tensor:
    """CPU stand-in for vLLM's GGUF MoE op (CUDA only): stage 4's cpu_reference_moe with
    the dequantized experts cached."""
    if activation != "silu":
        raise ValueError(f"standin_moe_gguf: activation {activation!r}, GLM-5 uses silu")
    w13 = _dequant(w1, qtype1)
    down = _dequant(w2, qtype2)
    xf = x.float()
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32)
    for j in range(topk_ids.shape[1]):
        for e in topk_ids[:, j].unique().tolist():
            rows = (topk_ids[:, j] == e).nonzero().squeeze(1)
            h = xf[rows] @ w13[e].T
            act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            out[rows] += topk_weights[rows, j, None].float() * (act @ down[e].T)
    return out.to(x.dtype)


def standin_gguf_embedding(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int, hidden_size: int,
                           dtype: torch.dtype | None = None) -> torch.Tensor:
    """CPU stand-in for vLLM's GGUF embedding op (ggml_dequantize of the rows, CUDA only)."""
    from vllm.model_executor.layers.quantization.gguf import UNQUANTIZED_TYPES

    if qweight_type in UNQUANTIZED_TYPES:
        return torch.embedding(qweight, x)
    rows = _dequant(qweight, qweight_type)[x.flatten().long()]
    return rows.to(dtype or torch.float32).view(*x.shape, hidden_size)


def standin_ggml_dequantize(w: torch.Tensor, qtype: int, m: int, n: int, dtype: torch.dtype | None = None
                            ) -> torch.Tensor:
    """CPU stand-in for vLLM's ggml_dequantize op (CUDA only), [m, n]."""
    return _dequant(w, qtype).reshape(m, n).to(dtype or torch.float16)


def standin_concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                                 slot_mapping: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor
                                 ) -> None:
    """CPU stand-in for vLLM's concat_and_cache_mla (CUDA only): row ``slot`` of the paged
    cache [blocks, page, kv_lora + rope] gets [kv_c | k_pe]; slot -1 is padding (skipped).
    ``fp8_ds_mla`` (what ``--kv-cache-dtype fp8`` becomes for the sparse backend, patch
    0013): the 656-byte rows of ``fp8_ds_mla.write``, byte-equal to the CUDA writer's."""
    if kv_cache_dtype == "fp8_ds_mla":
        from glm5_tools.diagnostics import fp8_ds_mla

        fp8_ds_mla.write(kv_c, k_pe, kv_cache, slot_mapping)
        return
    if kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        raise NotImplementedError(f"stand-in concat_and_cache_mla: kv_cache_dtype {kv_cache_dtype}")
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    keep = slot_mapping >= 0
    rows = torch.cat([kv_c, k_pe], dim=-1)[keep].to(kv_cache.dtype)
    flat[slot_mapping[keep].long()] = rows


def standin_indexer_k_quant_and_cache(k: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                      quant_block_size: int, scale_fmt: str | None) -> None:
    """CPU stand-in for vLLM's indexer_k_quant_and_cache (CUDA only): per token, k [D] in
    float8 e4m3 with one float32 scale per ``quant_block_size`` values (a power of two for
    ue8m0), stored in a page [page, D + 4 * D/quant_block_size] of uint8: the page's D-byte
    values first (token-major), then its scales."""
    page = kv_cache.shape[1]
    d = k.shape[-1]
    nsc = d // quant_block_size
    flat_cache = kv_cache.view(kv_cache.shape[0], -1)
    for t in range(k.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        b, o = divmod(slot, page)
        x = k[t].float().reshape(nsc, quant_block_size)
        amax = x.abs().amax(-1).clamp(min=1e-4)
        sc = amax / 448.0
        if scale_fmt == "ue8m0":
            sc = torch.exp2(torch.ceil(torch.log2(sc)))
        q = (x / sc[:, None]).to(torch.float8_e4m3fn).reshape(d)
        flat_cache[b, o * d:(o + 1) * d] = q.view(torch.uint8)
        base = page * d + o * 4 * nsc
        flat_cache[b, base:base + 4 * nsc] = sc.to(torch.float32).view(torch.uint8)


def standin_per_token_group_quant_fp8(x: torch.Tensor, group_size: int, eps: float = 1e-10,
                                      dtype: torch.dtype | None = None, column_major_scales: bool = False,
                                      tma_aligned_scales: bool = False, out_q: torch.Tensor | None = None,
                                      use_ue8m0: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU stand-in for the CUDA op per_token_group_fp8_quant that the indexer's query
    quantization (per_token_group_quant_fp8) runs on a GPU: per group of ``group_size``
    values a scale max(amax, eps) / 448 (rounded up to a power of two for ue8m0), values
    rounded to float8 e4m3 by torch. vLLM's Triton fallback is not used here: Triton 3.6's
    interpreter drops the exponent carry when rounding to float8 (124.0 -> 64.0, 31.5 ->
    16.0; the GPU rounds to 128 and 32), which would corrupt 2 % of the query values."""
    if column_major_scales or tma_aligned_scales or out_q is not None:
        raise NotImplementedError("stand-in per_token_group_quant_fp8: row-major scales only")
    fp8 = dtype or torch.float8_e4m3fn
    fmax = float(torch.finfo(fp8).max)
    g = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    scale = g.abs().amax(-1).clamp(min=eps) / fmax
    if use_ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (g / scale[..., None]).clamp(-fmax, fmax).to(fp8).reshape(x.shape)
    return q, scale


class _TopkShuffle:
    """The order the persistent_topk stand-in returns: a fresh random permutation of each
    row on every call (seeded, so a run is reproducible)."""

    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(20261207)
        self.calls = 0


_TOPK_SHUFFLE = _TopkShuffle()


def standin_persistent_topk(logits: torch.Tensor, lengths: torch.Tensor, output: torch.Tensor,
                            workspace: torch.Tensor, k: int, max_seq_len: int) -> None:
    """CPU stand-in for vLLM's persistent_topk (a CUDA op of its _C library; patch 0011's
    indexer calls it on a GPU for index_topk 512, 1024 and 2048, GLM-5's): into output
    [rows, k] each row's exact top-k set (the k best float32 scores among its first
    lengths[row] columns, ties at the k-th score to the earliest positions, -1 where the
    row has fewer) in a fresh random order on every call, with the -1 entries anywhere, as
    the H100 showed the real kernel returns its rows (docs/validation/e2e-gpu/det). 0011
    then puts every row in order with its Triton sort kernels, which run for real here."""
    rows, width = logits.shape
    cols = torch.arange(width)
    masked = logits.float().masked_fill(cols[None, :] >= lengths[:, None].long(), float("-inf"))
    kk = min(k, width)
    order = torch.sort(-masked, dim=1, stable=True).indices[:, :kk]
    sel = torch.where(torch.isfinite(masked.gather(1, order)), order, -1)
    full = torch.full((rows, k), -1, dtype=torch.int64)
    full[:, :kk] = sel
    perm = torch.argsort(torch.rand(rows, k, generator=_TOPK_SHUFFLE.gen), dim=1)
    _TOPK_SHUFFLE.calls += 1
    output.copy_(full.gather(1, perm).to(output.dtype))


_TOPK_LIBRARY: list[Any] = []


def _register_persistent_topk() -> None:
    """torch.ops._C.persistent_topk on the CPU: the stand-in (defined here when vLLM's _C,
    a CUDA library, did not load, as on a machine without a GPU driver)."""
    if _TOPK_LIBRARY:
        return
    try:
        torch.ops._C.persistent_topk  # noqa: B018
        lib = torch.library.Library("_C", "IMPL")
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("persistent_topk(Tensor logits, Tensor lengths, Tensor(a!) output, Tensor(b!) workspace, "
                   "int k, int max_seq_len) -> ()")
    lib.impl("persistent_topk", standin_persistent_topk, "CPU")
    _TOPK_LIBRARY.append(lib)


# The steps that take the persistent_topk path on the CPU: at most this many tokens (one more
# than 0011's SORT_RANK_MAX_ROWS, so both of its sort kernels run: the rank kernel for 1-4
# rows, the bitonic one for 5) and an index_topk of at most PERSISTENT_TOPK_MAX_K. Triton's
# interpreter sorts one row in ~0.05 s (rank) / ~0.5 s (bitonic) at k 32, 4 s / 20 s at k
# 2048: a prefill's rows take 0011's torch top-k instead (a GPU takes persistent_topk there
# too; the set is the same, the order the torch path's).
PERSISTENT_TOPK_ROWS = 5
PERSISTENT_TOPK_MAX_K = 256


def _step_rows() -> int:
    """Tokens of the forward step running now (its slot mapping's length)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return 0
    slots = get_forward_context().slot_mapping
    first = next(iter(slots[0].values() if isinstance(slots, list) else slots.values()), None)
    return 0 if first is None else int(first.shape[0])


def standin_topk_path(device: torch.device, topk: int) -> str:
    """Stand-in for the device in 0011's choice of top-k implementation: on the CPU, the path
    GLM-5's index_topk (2048) takes on a GPU, vLLM's persistent_topk (standin_persistent_topk
    here, then 0011's real sort kernels), whatever the index_topk, for steps of at most
    PERSISTENT_TOPK_ROWS tokens and index_topk up to PERSISTENT_TOPK_MAX_K; 0011's torch
    top-k for the others (what its topk_path gives the CPU)."""
    from vllm.v1.attention.backends.mla import sparse_utils

    real = _REAL_TOPK_PATH.get("fn") or sparse_utils.topk_path
    if device.type == "cpu":
        if topk > PERSISTENT_TOPK_MAX_K or _step_rows() > PERSISTENT_TOPK_ROWS:
            return "torch"
        return str(real(torch.device("cuda"), max(sparse_utils.PERSISTENT_TOPK_K)))
    return str(real(device, topk))


_REAL_TOPK_PATH: dict[str, Any] = {}


SERVICE_DTYPE = torch.bfloat16  # what the service runs (the backends accept fp16/bf16 only)
SERVICE_CAPABILITY = (12, 0)  # RTX PRO 6000 Blackwell
SERVICE_SM_COUNT = 188  # its streaming multiprocessors (the kernels' split counts read it)


def standin_get_attn_backend_cls(selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
                                 ) -> str:
    """Stand-in for the CUDA platform's backend selection (no GPU here): the configured
    backend, validated as CudaPlatform.get_attn_backend_cls validates a selected one, for
    compute capability 12.0 and the service's dtype (bfloat16; the CPU run may compute in
    float32, which the GPU backends do not list)."""
    from vllm.platforms.interface import DeviceCapability

    if selected_backend is None:
        raise ValueError("vllm_forward: an attention backend must be configured (--attention-backend)")
    cfg = attn_selector_config._replace(dtype=SERVICE_DTYPE)
    reasons = selected_backend.get_class().validate_configuration(
        device_capability=DeviceCapability(*SERVICE_CAPABILITY), **cfg._asdict())
    if reasons:
        raise ValueError(f"backend {selected_backend.name} refuses this configuration: {reasons}")
    return str(selected_backend.get_path())


@contextmanager
def cpu_standins() -> Iterator[None]:
    """Put the CPU stand-ins in place of vLLM's CUDA-only ops for the block."""
    import vllm._custom_ops as ops
    import vllm.model_executor.layers.quantization.gguf as vllm_gguf
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    import vllm.model_executor.models.deepseek_v2 as dv2
    from vllm.platforms import current_platform

    from glm5_tools.diagnostics.patching import replaced

    with ExitStack() as stack:
        stack.enter_context(replaced_attr(current_platform, "get_attn_backend_cls", standin_get_attn_backend_cls))
        # buffers vLLM allocates "on the platform's device" (the indexer's top-k buffer)
        stack.enter_context(replaced_attr(current_platform, "device_type", "cpu"))
        stack.enter_context(replaced_attr(current_platform, "num_compute_units",
                                          lambda device_id=0: SERVICE_SM_COUNT))
        stack.enter_context(replaced(dv2, per_token_group_quant_fp8=standin_per_token_group_quant_fp8))
        stack.enter_context(replaced(vllm_gguf, fused_mul_mat_gguf=standin_mul_mat_gguf,
                                     fused_moe_gguf=standin_moe_gguf,
                                     apply_gguf_embedding=standin_gguf_embedding))
        # sparse_attn_indexer.py imports vllm._custom_ops as ops on CUDA platforms only
        stack.enter_context(replaced_attr(sai, "ops", ops))
        stack.enter_context(replaced(ops, concat_and_cache_mla=standin_concat_and_cache_mla,
                                     ggml_dequantize=standin_ggml_dequantize,
                                     indexer_k_quant_and_cache=standin_indexer_k_quant_and_cache))
        # 0011's top-k: the path it takes on a GPU (persistent_topk for k 512/1024/2048,
        # stood in for; then its real sort kernels)
        from vllm.v1.attention.backends.mla import sparse_utils

        if getattr(sparse_utils, "topk_path", None) is not None:
            _REAL_TOPK_PATH.setdefault("fn", sparse_utils.topk_path)
            _register_persistent_topk()
            stack.enter_context(replaced(sparse_utils, topk_path=standin_topk_path))
            stack.enter_context(replaced(sai, topk_path=standin_topk_path))
        yield


@contextmanager
def replaced_attr(obj: Any, name: str, value: Any) -> Iterator[None]:
    """obj.name = value for the block (an instance attribute; removed afterwards)."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


# --- building the model -------------------------------------------------------------------------


def _free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


_DIST_READY = False


def _init_workspace() -> None:
    """vLLM's workspace manager on the CPU (GPUModelRunner makes it on its device; 0011's
    persistent_topk path takes its workspace from it)."""
    from vllm.v1.worker import workspace

    if workspace._manager is None:
        workspace.init_workspace_manager(torch.device("cpu"))


def _init_single_rank() -> None:
    global _DIST_READY
    if _DIST_READY:
        return
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    initialize_model_parallel(1, 1)
    _DIST_READY = True


@dataclass
class Taps:
    """Per-layer values of one forward, [T, ...] float32 each (name -> tensor)."""

    layers: list[dict[str, torch.Tensor]] = field(default_factory=list)


class VllmCpuModel:
    """vLLM's GlmMoeDsaForCausalLM loaded from a GGUF on the CPU, run one prompt at a time."""

    def __init__(self, gguf: Path | str, hf_dir: Path | str, backend: str, *, max_model_len: int = 512,
                 dtype: str = "float32", speculative_config: dict[str, Any] | None = None,
                 kv_cache_dtype: str = "auto") -> None:
        """``speculative_config``: what ``--speculative-config`` would get (e.g. ``{"method":
        "mtp", "num_speculative_tokens": 3}``); the drafter is then built and loaded as
        vLLM's proposer builds it (``self.drafter``, ``draft()``). ``kv_cache_dtype``: what
        ``--kv-cache-dtype`` would get; ``fp8`` (the sparse backend's fp8_ds_mla latent
        cache, patch 0013) needs ``dtype`` bfloat16, as on a GPU: that cache keeps bf16
        rope values and its kernel takes bf16 queries."""
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: one of {', '.join(KV_CACHE_DTYPES)}")
        if kv_cache_dtype == "fp8" and (backend != "TRITON_MLA_SPARSE" or dtype != "bfloat16"):
            raise ValueError("kv_cache_dtype fp8 (the fp8_ds_mla latent cache): TRITON_MLA_SPARSE in bfloat16 only")
        prepare_environment()
        from vllm.config import (
            AttentionConfig,
            CacheConfig,
            CompilationConfig,
            DeviceConfig,
            LoadConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.model_executor.model_loader import get_model_loader

        self.backend = backend
        self.kv_cache_dtype = kv_cache_dtype
        self.model_config = ModelConfig(model=str(gguf), tokenizer=str(hf_dir), hf_config_path=str(hf_dir),
                                        dtype=dtype, max_model_len=max_model_len, enforce_eager=True,
                                        quantization="gguf")
        parallel_config = ParallelConfig()
        # as EngineArgs.create_speculative_config makes it from --speculative-config
        spec = (SpeculativeConfig(**speculative_config, target_model_config=self.model_config,
                                  target_parallel_config=parallel_config)
                if speculative_config is not None else None)
        self.vllm_config = VllmConfig(
            parallel_config=parallel_config,
            speculative_config=spec,
            model_config=self.model_config,
            device_config=DeviceConfig(device="cpu"),
            load_config=LoadConfig(load_format="gguf"),
            cache_config=CacheConfig(block_size=BLOCK, cache_dtype=kv_cache_dtype),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=max_model_len, max_num_seqs=max_model_len,
                                             max_model_len=max_model_len, is_encoder_decoder=False),
            attention_config=AttentionConfig(backend=backend),
            # vLLM's CustomOps (RMSNorm, RoPE, SiluAndMul, ...) take their forward_native,
            # vLLM's own PyTorch path: their forward_cuda calls CUDA kernels
            compilation_config=CompilationConfig(custom_ops=["none"]),
        )
        with set_current_vllm_config(self.vllm_config):
            _init_single_rank()
            _init_workspace()
            with cpu_standins(), torch.device("cpu"):
                loader = get_model_loader(self.vllm_config.load_config)
                self.model = loader.load_model(vllm_config=self.vllm_config, model_config=self.model_config)
                self.drafter = self._load_drafter() if spec is not None else None
            self.model.eval()
            self._indexer_ops_as_on_cuda()
            self.dtype = self.model_config.dtype
            self._attn_layers = self._attention_layers()
            self._alloc_caches(max_model_len)

    def _load_drafter(self) -> Any:
        """The speculative drafter as vLLM's proposer loads it (LLMBaseProposer._get_model
        and load_model): get_model with the draft model and load configs, then the
        proposer's own sharing of the target's embedding, LM head and top-k buffer
        (its methods, called on a stand-in for the proposer object, which holds GPU
        buffers)."""
        from types import SimpleNamespace

        from vllm.model_executor.model_loader import get_model
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        spec = self.vllm_config.speculative_config
        drafter = get_model(vllm_config=self.vllm_config, model_config=spec.draft_model_config,
                            load_config=spec.draft_load_config)
        proposer = SimpleNamespace(model=drafter, use_local_argmax_reduction=False)
        SpecDecodeBaseProposer._maybe_share_embeddings(proposer, self.model)
        SpecDecodeBaseProposer._maybe_share_lm_head(proposer, self.model)
        return proposer.model

    def _indexer_ops_as_on_cuda(self) -> None:
        """SparseAttnIndexer's forward_native only dispatches to forward_cuda on a CUDA
        platform (and raises elsewhere); forward_cuda is Python calling the Triton indexer
        op (patch 0011): take it, as the CUDA platform does."""
        from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

        models = [self.model] + ([self.drafter] if self.drafter is not None else [])
        for mod in (m for model in models for m in model.modules()):
            if isinstance(mod, SparseAttnIndexer):
                mod._forward_method = mod.forward_cuda

    # the attention layers (MLAAttention) and, for the sparse path, the indexer caches
    def _attention_layers(self) -> dict[str, Any]:
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        ctx = self.vllm_config.compilation_config.static_forward_context
        return {name: layer for name, layer in ctx.items() if isinstance(layer, AttentionLayerBase)}

    def _alloc_caches(self, max_model_len: int) -> None:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        self.num_blocks = (max_model_len + BLOCK - 1) // BLOCK + 1
        self.specs = {}
        for name, layer in self._attn_layers.items():
            spec = layer.get_kv_cache_spec(self.vllm_config)
            self.specs[name] = spec
            if isinstance(layer, MLAAttention):
                # the backend's own cache shape (fp8_ds_mla: uint8 rows of 656 bytes)
                shape = layer.get_attn_backend().get_kv_cache_shape(
                    self.num_blocks, BLOCK, 1, layer.head_size, cache_dtype_str=layer.kv_cache_dtype)
                dtype = torch.uint8 if layer.kv_cache_dtype == "fp8_ds_mla" else self.dtype
                layer.kv_cache = torch.zeros(shape, dtype=dtype)
            else:  # DSA indexer key cache (fp8 values + float32 scales, bytes)
                layer.kv_cache = torch.zeros(self.num_blocks, BLOCK, spec.head_size, dtype=torch.uint8)

    def _common_metadata(self, query_lens: list[int], seq_lens: list[int], block_table: torch.Tensor,
                         slots: torch.Tensor) -> Any:
        from vllm.v1.attention.backend import CommonAttentionMetadata

        qsl = torch.tensor([0, *np.cumsum(query_lens).tolist()], dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        return CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl,
            num_reqs=len(query_lens), num_actual_tokens=int(sum(query_lens)),
            max_query_len=max(query_lens), max_seq_len=max(seq_lens),
            block_table_tensor=block_table, slot_mapping=slots, causal=True,
            _seq_lens_cpu=sl.clone(), seq_lens_cpu_upper_bound=sl.clone(),
            _num_computed_tokens_cpu=sl - torch.tensor(query_lens, dtype=torch.int32),
        )

    def _metadata(self, t: int, start: int = 0) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Per layer name: attention metadata for the tokens at positions start..t-1 of a
        sequence of t tokens (positions before start already in the caches), built by
        the backends' own metadata builders, and the slot mapping (position p -> slot p)."""
        nblk = (t + BLOCK - 1) // BLOCK
        # blocks in reverse order so that a block-table fault cannot pass by identity
        blocks = torch.arange(self.num_blocks - 1, self.num_blocks - 1 - nblk, -1, dtype=torch.int32)
        pos = torch.arange(start, t)
        slots = (blocks[pos // BLOCK].long() * BLOCK + pos % BLOCK).to(torch.int64)
        n = t - start
        if self.backend == "TRITON_MLA":
            # every position as one decode request: query 1 token, context positions 0..p
            cm = self._common_metadata([1] * n, [p + 1 for p in range(start, t)],
                                       blocks[None, :].expand(n, nblk).contiguous(), slots)
        else:
            cm = self._common_metadata([n], [t], blocks[None, :].contiguous(), slots)
        return self.build_metadata(cm), {name: slots for name in self._attn_layers}

    def block_table(self, t: int) -> torch.Tensor:
        """The blocks of a sequence of up to t tokens, [1, blocks] int32: in reverse order
        from the last block, so that a block-table fault cannot pass by identity."""
        nblk = (t + BLOCK - 1) // BLOCK
        return torch.arange(self.num_blocks - 1, self.num_blocks - 1 - nblk, -1, dtype=torch.int32)[None, :]

    def common_metadata(self, query_lens: list[int], seq_lens: list[int], block_table: torch.Tensor,
                        slots: torch.Tensor) -> Any:
        """vLLM's CommonAttentionMetadata of one scheduled batch (what the model runner
        builds each step): per request its query and sequence length, the block table
        [requests, blocks] and the scheduled tokens' cache slots."""
        return self._common_metadata(query_lens, seq_lens, block_table, slots)

    def build_metadata(self, cm: Any) -> dict[str, Any]:
        """Per attention layer: the metadata its backend's own builder makes of cm (one
        builder per backend and cache spec, as the model runner keeps one per group)."""
        metadata: dict[str, Any] = {}
        builders: dict[tuple[type, int], Any] = {}
        for name, layer in self._attn_layers.items():
            spec = self.specs[name]
            cls = layer.get_attn_backend().get_builder_cls()
            key = (cls, id(type(spec)))
            if key not in builders:
                builders[key] = cls(spec, [name], self.vllm_config, torch.device("cpu"))
            metadata[name] = builders[key].build(common_prefix_len=0, common_attn_metadata=cm)
        return metadata

    def run(self, model: Any, cm: Any, input_ids: torch.Tensor, positions: torch.Tensor, **inputs: Any
            ) -> torch.Tensor:
        """One forward of model (the target or the drafter) over the batch cm schedules:
        input_ids and positions [tokens], writing the caches at cm's slots."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
            metadata = self.build_metadata(cm)
            slots = {name: cm.slot_mapping for name in self._attn_layers}
            with set_forward_context(metadata, self.vllm_config, num_tokens=int(input_ids.shape[0]),
                                     slot_mapping=slots):
                out: torch.Tensor = model(input_ids=input_ids, positions=positions, **inputs)
        return out

    def logits(self, model: Any, hidden: torch.Tensor) -> torch.Tensor:
        """model.compute_logits of hidden [n, d] -> [n, vocab] float32."""
        from vllm.config import set_current_vllm_config

        with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
            out = model.compute_logits(hidden)
        return out[:, : self.model_config.hf_config.vocab_size].float()

    def reset_caches(self) -> None:
        for layer in self._attn_layers.values():
            layer.kv_cache.zero_()

    def forward(self, tokens: list[int], *, taps: Taps | None = None) -> torch.Tensor:
        """Logits [T, V] (float32) of one prompt; per-layer values into taps. The model's
        output hidden states (after its final norm: what vLLM hands a drafter) are kept
        as ``self.hidden`` [T, hidden] float32."""
        from vllm.config import set_current_vllm_config

        t = len(tokens)
        for layer in self._attn_layers.values():
            layer.kv_cache.zero_()
        hooks = _install_taps(self.model, taps) if taps is not None else []
        try:
            hidden = self._step(self.model, t, 0, input_ids=torch.tensor(tokens, dtype=torch.long),
                                intermediate_tensors=None)
            with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
                logits = self.model.compute_logits(hidden)
        finally:
            for h in hooks:
                h.remove()
        self.hidden = hidden.detach().float().clone()
        return logits[:, : self.model_config.hf_config.vocab_size].float()

    def forward_tail(self, tokens: list[int], tail: int) -> torch.Tensor:
        """Logits [tail, V] of the last ``tail`` tokens, run as a second step after a
        prefill of the others: with a speculative config and tail <= 1 +
        num_speculative_tokens, the backends' builders classify that step as decode
        tokens, as they do the target's verification of the drafts in serving."""
        from vllm.config import set_current_vllm_config

        t = len(tokens)
        if not 0 < tail < t:
            raise ValueError(f"forward_tail: tail {tail} of {t} tokens")
        for layer in self._attn_layers.values():
            layer.kv_cache.zero_()
        ids = torch.tensor(tokens, dtype=torch.long)
        self._step(self.model, t - tail, 0, input_ids=ids[: t - tail], intermediate_tensors=None)
        hidden = self._step(self.model, t, t - tail, input_ids=ids[t - tail :], intermediate_tensors=None)
        with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
            logits = self.model.compute_logits(hidden)
        return logits[:, : self.model_config.hf_config.vocab_size].float()

    def decode_rows(self, tokens: list[int], rows: int, *, taps: Taps | None = None) -> torch.Tensor:
        """Logits [rows, V] of the last ``rows`` positions of tokens run as one decode step
        of ``rows`` requests, one token each (request j's context: the tokens up to its
        position), over the caches a forward(tokens) just left: the step writes the same
        cache rows again and reads them through the backends' decode paths (for the sparse
        backend at most PERSISTENT_TOPK_ROWS rows take the persistent_topk path and 0011's
        sort kernels)."""
        t = len(tokens)
        if not 0 < rows < t:
            raise ValueError(f"decode_rows: {rows} rows of {t} tokens")
        start = t - rows
        blocks = self.block_table(t)[0]
        pos = torch.arange(start, t)
        slots = (blocks[pos // BLOCK].long() * BLOCK + pos % BLOCK).to(torch.int64)
        cm = self._common_metadata([1] * rows, [p + 1 for p in range(start, t)],
                                   blocks[None, :].expand(rows, blocks.shape[0]).contiguous(), slots)
        hooks = _install_taps(self.model, taps) if taps is not None else []
        try:
            hidden = self.run(self.model, cm, torch.tensor(tokens[start:], dtype=torch.long), pos,
                              intermediate_tensors=None)
            return self.logits(self.model, hidden)
        finally:
            for h in hooks:
                h.remove()

    def _step(self, model: Any, t: int, start: int, **inputs: Any) -> torch.Tensor:
        """One forward of model over the tokens at positions start..t-1 (earlier positions
        in the caches)."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        positions = torch.arange(start, t, dtype=torch.long)
        with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
            metadata, slot_mapping = self._metadata(t, start)
            with set_forward_context(metadata, self.vllm_config, num_tokens=t - start, slot_mapping=slot_mapping):
                out: torch.Tensor = model(positions=positions, **inputs)
        return out

    def draft(self, tokens: list[int]) -> DraftRun:
        """What vLLM's proposer drafts after a prefill of tokens, greedy, one request
        (LLMBaseProposer.propose, chain of num_speculative_tokens): the target's forward
        gives the next token and its hidden states; the first draft step runs the drafter
        over positions 0..T-1 with the token ids shifted by one (the next token last) and
        the target's hidden states; each further step one token (the previous step's
        argmax) at the next position with the hidden state the previous step returned."""
        if self.drafter is None:
            raise ValueError("draft(): the model was built without a speculative_config")
        from vllm.config import set_current_vllm_config

        steps = int(self.vllm_config.speculative_config.num_speculative_tokens)
        vocab = self.model_config.hf_config.vocab_size
        target = self.forward(tokens)
        t = len(tokens)
        nxt = int(target[-1].argmax())
        ids = torch.tensor([*tokens[1:], nxt], dtype=torch.long)
        hidden_in = self.hidden
        run = DraftRun(target_logits=target, target_hidden=self.hidden, next_token=nxt)
        start, end = 0, t
        for _ in range(steps):
            out = self._step(self.drafter, end, start, input_ids=ids, hidden_states=hidden_in,
                             inputs_embeds=None)
            with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins():
                logits = self.drafter.compute_logits(out[-1:])[0, :vocab].float()
            run.logits.append(logits)
            run.carried.append(out[-1].detach().float().clone())
            run.inputs.append(int(ids[-1]))
            drafted = int(logits.argmax())
            run.drafted.append(drafted)
            ids = torch.tensor([drafted], dtype=torch.long)
            hidden_in = out[-1:]
            start, end = end, end + 1
        return run


@dataclass
class DraftRun:
    """One greedy draft chain (VllmCpuModel.draft): the target's logits [T, V] and hidden
    states [T, hidden] of the prompt, its next token, and per draft step k (0-based) the
    drafter's logits [V], the token it took in at the step's last position, the hidden
    state it returned there (what step k+1 takes in) and its argmax."""

    target_logits: torch.Tensor
    target_hidden: torch.Tensor
    next_token: int
    logits: list[torch.Tensor] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    carried: list[torch.Tensor] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)


def _install_taps(model: torch.nn.Module, taps: Taps) -> list[Any]:
    """Forward hooks on the decoder layers' sub-blocks; each layer's values go to
    taps.layers[i]: attn_norm, attn (after o_proj), ffn_norm, mlp (dense or MoE output),
    and for MoE layers router_logits, topk_ids, topk_weights (as the router returns them,
    before the runner's routed scaling), shared (shared expert), routed (mlp - shared),
    then out (the residual stream after the layer)."""
    hooks: list[Any] = []
    layers = model.model.layers
    taps.layers = [{} for _ in layers]

    def put(i: int, name: str, value: torch.Tensor) -> None:
        taps.layers[i][name] = value.detach().float().clone()

    for i, layer in enumerate(layers):
        def pre_norm(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
            put(i, "attn_norm", out[0] if isinstance(out, tuple) else out)

        def attn(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, i: int = i) -> None:
            put(i, "attn", out)

        def post_norm(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
            put(i, "ffn_norm", out[0] if isinstance(out, tuple) else out)

        def mlp(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
            put(i, "mlp", out)
            if "shared" in taps.layers[i]:
                taps.layers[i]["routed"] = taps.layers[i]["mlp"] - taps.layers[i]["shared"]

        def block(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
            hidden, residual = out
            put(i, "out", hidden + residual)

        indexer = getattr(layer.self_attn, "indexer", None)
        if indexer is not None:
            def selection(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
                # request-local key positions per token (-1: none), as the indexer op wrote them
                t = args[0].shape[0]
                taps.layers[i]["topk_indices"] = out[:t].detach().clone().long()

            hooks.append(indexer.register_forward_hook(selection))
        hooks.append(layer.input_layernorm.register_forward_hook(pre_norm))
        hooks.append(layer.self_attn.register_forward_hook(attn, with_kwargs=True))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(post_norm))
        hooks.append(layer.mlp.register_forward_hook(mlp))
        hooks.append(layer.register_forward_hook(block))
        moe = layer.mlp
        if hasattr(moe, "experts") and hasattr(moe, "gate"):
            def gate(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
                put(i, "router_logits", out[0] if isinstance(out, tuple) else out)

            def shared(mod: Any, args: tuple[Any, ...], out: Any, i: int = i) -> None:
                put(i, "shared", out)

            hooks.append(moe.gate.register_forward_hook(gate))
            if moe.shared_experts is not None:
                hooks.append(moe.shared_experts.register_forward_hook(shared))
            router = moe.experts.router
            real = router.select_experts

            def select(*args: Any, i: int = i, real: Any = real, **kwargs: Any) -> Any:
                weights, ids = real(*args, **kwargs)
                put(i, "topk_weights", weights)
                taps.layers[i]["topk_ids"] = ids.detach().clone().long()
                return weights, ids

            router.select_experts = select
            hooks.append(_Restore(router, "select_experts"))
    return hooks


class _Restore:
    """A hook-like handle that deletes an instance attribute on remove()."""

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name

    def remove(self) -> None:
        self.obj.__dict__.pop(self.name, None)
