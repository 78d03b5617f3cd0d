"""GLM-5's serving path, traced at its per-rank shapes (the project's scenario set).

Runs vLLM's own launch sites -- the metadata builders, the TRITON_MLA_SPARSE
backend's forward (patch 0011), the DSA indexer op, TRITON_MLA's decode forward
(the dense path, patch 0004), the model runner's slot mapping and the sampler's
top-k/top-p -- on CPU tensors under a virtual device of
the target (see trace.py), for tensor parallel 1, 2, 4 and 8 (64/TP query heads
per rank; the indexer's 32 heads are replicated, not split), decode, prefill,
chunked prefill (a chunk after a cached prefix) and mixed batches, and CUDA
graph capture of uniform decode batches. Launch parameters that depend on the
batch (the sparse MLA's split count: tokens x head blocks against the SM count)
or on the context length (TRITON_MLA's KV splits) are swept over their whole
range, so every constexpr value the device can see is recorded.

Needs the patched vLLM tree first on sys.path (the deployed host's own tree, or
devtests' overlay) and must run in a fresh process: vLLM binds its platform at
import, and the virtual platform must be in place first.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .targets import Target
from .trace import Recorder, install_vllm_platform, recording, recording_ops, virtual_device

# GLM-5 (config.json of zai-org/GLM-5)
HEADS = 64
KV_LORA = 512
ROPE = 64
QK_NOPE = 192
V_HEAD = 256
INDEX_HEADS = 32
INDEX_DIM = 128
INDEX_TOPK = 2048
VOCAB = 154880
MAX_MODEL_LEN = 202752  # max_position_embeddings; the sparse service's default
PAGE = 64  # TRITON_MLA_SPARSE's kernel block size (and the indexer cache's)
QUANT_BLOCK = 128
# vLLM's defaults for an OpenAI server on a large GPU (the unit sets neither)
MAX_BATCHED_TOKENS = 8192
MAX_SEQS = 512
TPS = (1, 2, 4, 8)
# decode batch sizes (tokens): every split count 1..64 of the sparse MLA at every TP
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# context lengths: every KV split count of TRITON_MLA's decode (max_seq_len // 512,
# a power of two, at most 2 x SMs), up to GLM-5's whole context
DENSE_CONTEXTS = (100, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, MAX_MODEL_LEN)


@dataclass(frozen=True)
class Batch:
    """Requests as (query tokens, context length incl. them); decodes first, as vLLM orders them."""

    name: str
    requests: tuple[tuple[int, int], ...]

    @property
    def tokens(self) -> int:
        return sum(q for q, _ in self.requests)


def sparse_batches() -> Iterator[Batch]:
    for n in DECODE_BATCHES:
        yield Batch(f"decode x{n}", tuple((1, 3000 + 7 * i) for i in range(n)))
    yield Batch("prefill 1000", ((1000, 1000),))
    yield Batch("chunked prefill 2048 after 6000 cached", ((2048, 8048),))
    yield Batch("mixed 4 decodes + prefill chunk 512 after 1500", (*((1, 2500 + i) for i in range(4)), (512, 2012)))
    yield Batch(f"prefill {MAX_BATCHED_TOKENS} (a full step)", ((MAX_BATCHED_TOKENS, MAX_BATCHED_TOKENS),))


def _config(backend: Any) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=MAX_BATCHED_TOKENS, max_num_seqs=MAX_SEQS, max_model_len=MAX_MODEL_LEN
        ),
        model_config=SimpleNamespace(
            max_model_len=MAX_MODEL_LEN,
            hf_config=SimpleNamespace(
                index_topk=INDEX_TOPK, index_n_heads=INDEX_HEADS, index_head_dim=INDEX_DIM, kv_lora_rank=KV_LORA
            ),
            dtype=None,
        ),
        speculative_config=None,
        attention_config=SimpleNamespace(backend=backend, use_fp4_indexer_cache=False),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
        cache_config=SimpleNamespace(block_size=PAGE, cache_dtype="auto"),
        compilation_config=SimpleNamespace(cudagraph_mode=None),
    )


def _common(batch: Batch) -> Any:
    import numpy as np
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = [n for n, _ in batch.requests]
    s = [c for _, c in batch.requests]
    qsl = torch.tensor([0, *np.cumsum(q).tolist()], dtype=torch.int32)
    seq = torch.tensor(s, dtype=torch.int32)
    blocks = max(math.ceil(c / PAGE) for c in s)
    # nothing runs: every request may name the same blocks
    table = torch.arange(blocks, dtype=torch.int32).repeat(len(s), 1)
    slots = torch.cat([torch.arange(c - n, c, dtype=torch.int64) for n, c in batch.requests])
    fields = {
        "query_start_loc": qsl,
        "query_start_loc_cpu": qsl.clone(),
        "seq_lens": seq,
        "num_reqs": len(s),
        "num_actual_tokens": batch.tokens,
        "max_query_len": max(q),
        "max_seq_len": max(s),
        "block_table_tensor": table,
        "slot_mapping": slots,
        "causal": True,
    }
    params = inspect.signature(CommonAttentionMetadata).parameters
    if "_seq_lens_cpu" in params:
        fields["_seq_lens_cpu"] = seq.clone()
    if "_num_computed_tokens_cpu" in params:
        fields["_num_computed_tokens_cpu"] = seq - torch.tensor(q, dtype=torch.int32)
    if "seq_lens_cpu_upper_bound" in params:
        fields["seq_lens_cpu_upper_bound"] = seq.clone()
    return CommonAttentionMetadata(**fields)


def _call(fn: Callable[..., Any], values: dict[str, Any]) -> Any:
    """fn with the arguments its signature names (a new required one fails loudly)."""
    params = inspect.signature(fn).parameters
    var = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [
        p for p, v in params.items() if v.default is inspect.Parameter.empty and v.kind not in var and p not in values
    ]
    if missing:
        raise TypeError(f"{fn.__qualname__} takes arguments this trace does not know: {missing}")
    if any(v.kind is inspect.Parameter.VAR_KEYWORD for v in params.values()):
        return fn(**values)
    return fn(**{p: values[p] for p in params if p in values})


def trace_sparse(rec: Recorder, target: Target, tp: int) -> None:
    """TRITON_MLA_SPARSE (0011): the indexer op and the sparse MLA forward."""
    import torch
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.backends.mla import sparse_utils as su
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum.TRITON_MLA_SPARSE.get_class()
    config = _config(AttentionBackendEnum.TRITON_MLA_SPARSE)
    heads = HEADS // tp
    cpu = torch.device("cpu")
    spec = SimpleNamespace(block_size=PAGE, storage_block_size=PAGE, num_kv_heads=1, head_size=KV_LORA + ROPE)
    idx_builder = DeepseekV32IndexerMetadataBuilder(spec, ["model.layers.0.self_attn.indexer.k_cache"], config, cpu)
    mla_builder = backend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], config, cpu)
    topk_buffer = torch.empty(MAX_BATCHED_TOKENS, INDEX_TOPK, dtype=torch.int32)
    impl = _call(
        backend.get_impl_cls(),
        {
            "num_heads": heads,
            "head_size": KV_LORA + ROPE,
            "scale": (QK_NOPE + ROPE) ** -0.5,
            "num_kv_heads": 1,
            "alibi_slopes": None,
            "sliding_window": None,
            "kv_cache_dtype": "auto",
            "logits_soft_cap": None,
            "attn_type": "decoder",
            "kv_sharing_target_layer_name": None,
            "indexer": SimpleNamespace(topk_indices_buffer=topk_buffer),
            "q_lora_rank": 2048,
            "kv_lora_rank": KV_LORA,
            "qk_nope_head_dim": QK_NOPE,
            "qk_rope_head_dim": ROPE,
            "qk_head_dim": QK_NOPE + ROPE,
            "v_head_dim": V_HEAD,
            "kv_b_proj": None,
        },
    )
    layer = SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1), _q_scale=torch.ones(1))
    prefix = "model.layers.0.self_attn.indexer.k_cache"
    for batch in sparse_batches():
        for capturing in (False, True) if batch.name.startswith("decode") else (False,):
            label = f"TP{tp} sparse {batch.name}" + (" (graph capture)" if capturing else "")
            with rec.in_scenario(label), virtual_device(target, capturing=capturing):
                common = _common(batch)
                blocks = int(common.block_table_tensor.shape[1])
                idx_meta = idx_builder.build(0, common)
                metas = {prefix: idx_meta}
                n = batch.tokens
                idx_cache = torch.empty(blocks, PAGE, INDEX_DIM + 4, dtype=torch.uint8)
                q_fp8 = torch.empty(n, INDEX_HEADS, INDEX_DIM, dtype=torch.float8_e4m3fn)
                context = SimpleNamespace(attn_metadata=metas)
                saved = sai.get_forward_context
                sai.get_forward_context = lambda context=context: context
                try:
                    _call(
                        sai.sparse_attn_indexer_triton,
                        {
                            "hidden_states": torch.empty(n, 16, dtype=torch.bfloat16),
                            "k_cache_prefix": prefix,
                            "kv_cache": idx_cache,
                            "q_quant": q_fp8,
                            "q_fp8": q_fp8,
                            "q_scale": None,
                            "k": torch.empty(n, INDEX_DIM, dtype=torch.bfloat16),
                            "weights": torch.empty(n, INDEX_HEADS, dtype=torch.float32),
                            "quant_block_size": QUANT_BLOCK,
                            "scale_fmt": "ue8m0",
                            "topk_tokens": INDEX_TOPK,
                            "head_dim": INDEX_DIM,
                            "max_model_len": MAX_MODEL_LEN,
                            "total_seq_lens": int(common.seq_lens.sum()),
                            "topk_indices_buffer": topk_buffer,
                            "skip_k_cache_insert": False,
                            "use_fp4_cache": False,
                        },
                    )
                finally:
                    sai.get_forward_context = saved
                # on the device the indexer's top-k is vLLM's persistent_topk (its op is
                # listed by libs.py) and 0011 then sorts each row into the selection
                # (sparse_utils.indexer_topk); here, on CPU tensors, the indexer took the
                # torch top-k, so the sort is launched as indexer_topk launches it
                width = MAX_MODEL_LEN if capturing else int(common.max_seq_len)
                scratch = torch.empty(n, INDEX_TOPK, dtype=torch.int32)
                su.sort_topk_rows(scratch, topk_buffer[:n, :INDEX_TOPK], max(1, width))
                topk_buffer[:n].random_(-1, min(common.max_seq_len, INDEX_TOPK))
                meta = mla_builder.build(0, common)
                q = torch.empty(n, heads, KV_LORA + ROPE, dtype=torch.bfloat16)
                kv = torch.empty(blocks, PAGE, KV_LORA + ROPE, dtype=torch.bfloat16)
                impl.forward_mqa(q, kv, meta, layer)


def trace_dense(rec: Recorder, target: Target, tp: int) -> None:
    """TRITON_MLA's decode (the dense path, 0004): vLLM's grouped decode kernels."""
    import torch
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAImpl

    heads = HEADS // tp
    # the decode forward reads these attributes only; the full constructor needs
    # the model's projection layers
    impl = TritonMLAImpl.__new__(TritonMLAImpl)
    impl.kv_lora_rank = KV_LORA
    impl.scale = (QK_NOPE + ROPE) ** -0.5
    impl.kv_cache_dtype = "auto"
    impl._sm_count = target.sm_count
    layer = SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1), _q_scale=torch.ones(1))
    for ctx in DENSE_CONTEXTS:
        for n in (1, 64):
            with rec.in_scenario(f"TP{tp} dense decode x{n} ctx {ctx}"), virtual_device(target):
                blocks = math.ceil(ctx / PAGE)
                decode = SimpleNamespace(
                    block_table=torch.zeros(n, blocks, dtype=torch.int32),
                    seq_lens=torch.full((n,), ctx, dtype=torch.int32),
                )
                meta = SimpleNamespace(decode=decode, max_seq_len=ctx, num_decodes=n)
                q = torch.empty(n, heads, KV_LORA + ROPE, dtype=torch.bfloat16)
                kv = torch.empty(max(blocks, 1), PAGE, KV_LORA + ROPE, dtype=torch.bfloat16)
                impl.forward_mqa(q, kv, meta, layer)


def trace_model_runner(rec: Recorder, target: Target) -> None:
    """The model runner's per-step Triton kernels that do not depend on the model:
    the slot mapping of vLLM's block table (one KV cache group, page 64)."""
    import torch
    from vllm.v1.worker.block_table import MultiGroupBlockTable

    table = _call(
        MultiGroupBlockTable,
        {
            "max_num_reqs": MAX_SEQS,
            "max_model_len": MAX_MODEL_LEN,
            "max_num_batched_tokens": MAX_BATCHED_TOKENS,
            "pin_memory": False,
            "device": torch.device("cpu"),
            "block_sizes": [PAGE],
            "kernel_block_sizes": [PAGE],
        },
    )
    for batch in (Batch("decode x64", tuple((1, 3000) for _ in range(64))), *list(sparse_batches())[-4:]):
        with rec.in_scenario(f"model runner {batch.name}"), virtual_device(target):
            common = _common(batch)
            positions = torch.cat([torch.arange(c - n, c) for n, c in batch.requests])
            table.compute_slot_mapping(len(batch.requests), common.query_start_loc, positions)


def trace_sampler(rec: Recorder, target: Target) -> None:
    """The sampler's Triton top-k/top-p (vLLM takes it for 8 or more requests that set
    top_k or top_p), over GLM-5's vocabulary, for top-k, top-p and both."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    for n in (8, MAX_SEQS):
        for name, k, p in (
            ("top_k", torch.full((n,), 40), None),
            ("top_p", None, torch.full((n,), 0.9)),
            ("top_k+top_p", torch.full((n,), 40), torch.full((n,), 0.9)),
        ):
            with rec.in_scenario(f"sampler {name} x{n}"), virtual_device(target):
                apply_top_k_top_p(torch.empty(n, VOCAB, dtype=torch.float32), k, p)


# GLM-5's GGUF linears per rank (UD-Q4_K_XL's types: docs/fixtures.md), as (name, in,
# out at TP 1, split by TP, GGUF type): q_a + kv_a are vLLM's merged fused_qkv_a_proj
HIDDEN = 6144
Q_LORA = 2048
MOE_INTER = 2048
SHARED_INTER = 2048
EXPERTS = 256
TOPK = 8
GGUF_Q4_K, GGUF_Q5_K, GGUF_Q6_K = 12, 13, 14
GGUF_BYTES = {GGUF_Q4_K: 144, GGUF_Q5_K: 176, GGUF_Q6_K: 210}
# decode steps, MTP verification steps (1 + 1..3 drafts per request) and prefill chunks
# The GGUF Triton kernels (the triton mode of GLM5_GGUF_KERNELS): their configurations
# are chosen by per-rank shape, so every TP; --gguf-tp narrows it for a quick look.
GGUF_TPS = TPS
GGUF_STEPS = (*DECODE_BATCHES, 2 * 64, 4 * 64, 1000, 2048, MAX_BATCHED_TOKENS)


def trace_gguf(rec: Recorder, target: Target, tp: int) -> None:
    """The GGUF weight kernels (patch 0015's gguf_triton, through gguf.py's own
    dispatch in its triton mode: dense layers, the merged q_a + kv_a layer, the
    routed experts) at every step size at which that mode takes them, with the
    per-rank shapes of TP tp; at the other step sizes (vLLM's compiled GGUF ops serve
    them: the library check) the kernels' own tables through their entry points, so
    that every configuration the bench can pick compiles too."""
    import torch
    from vllm.model_executor.layers.quantization import gguf as vgguf
    from vllm.model_executor.layers.quantization import gguf_triton as gt

    def qweight(rows: int, k: int, qtype: int) -> Any:
        return torch.empty(rows, k // 256 * GGUF_BYTES[qtype], dtype=torch.uint8)

    heads = HEADS // tp
    dense = [
        ("q_b", qweight(heads * (QK_NOPE + ROPE), Q_LORA, GGUF_Q5_K), GGUF_Q5_K),
        ("o_proj", qweight(HIDDEN, heads * V_HEAD, GGUF_Q5_K), GGUF_Q5_K),
        ("shared gate_up", qweight(2 * SHARED_INTER // tp, HIDDEN, GGUF_Q6_K), GGUF_Q6_K),
        ("shared down", qweight(HIDDEN, SHARED_INTER // tp, GGUF_Q6_K), GGUF_Q6_K),
        ("lm_head", qweight(VOCAB // tp, HIDDEN, GGUF_Q6_K), GGUF_Q6_K),
    ]
    q_a, kv_a = qweight(Q_LORA, HIDDEN, GGUF_Q5_K), qweight(KV_LORA + ROPE, HIDDEN, GGUF_Q6_K)
    padded = torch.empty(q_a.shape[0] + kv_a.shape[0], max(q_a.shape[1], kv_a.shape[1]), dtype=torch.uint8)
    inter = MOE_INTER // tp
    w13 = torch.empty(EXPERTS, 2 * inter, HIDDEN // 256 * GGUF_BYTES[GGUF_Q4_K], dtype=torch.uint8)
    w2 = torch.empty(EXPERTS, HIDDEN, inter // 256 * GGUF_BYTES[GGUF_Q5_K], dtype=torch.uint8)
    saved = vgguf.GGUF_KERNELS
    vgguf.GGUF_KERNELS = "triton"
    try:
        for m in GGUF_STEPS:
            # a linear the dispatch gives the Triton kernels at this step size is traced
            # through it (gguf.py's own calls); the others through the kernels' own
            # table (the tensor-core form past the dispatch's range): what the bench
            # sweeps and a wider range would serve compiles too
            def served(qtype: int, rows: int, m: int = m) -> bool:
                lo, hi = vgguf.triton_dense_tokens(qtype, rows)
                return bool(lo <= m <= hi)

            by_dispatch = [(w, q) for _, w, q in dense if served(q, w.shape[0])]
            by_table = [(w, q) for _, w, q in dense if not served(q, w.shape[0])]
            # the merged q_a + kv_a layer, shard by shard as the dispatch serves them (a
            # shard left to vLLM's ops is not traced: those are the library check's)
            shards = [(start, end, width, qtype) for start, end, width, qtype in (
                (0, Q_LORA, q_a.shape[1], GGUF_Q5_K), (Q_LORA, padded.shape[0], kv_a.shape[1], GGUF_Q6_K))
                if served(qtype, end - start)]
            if by_dispatch or shards:
                with rec.in_scenario(f"TP{tp} GGUF linears x{m}"), virtual_device(target):
                    for w, qtype in by_dispatch:
                        x = torch.empty(m, w.shape[1] // GGUF_BYTES[qtype] * 256, dtype=torch.float16)
                        vgguf._fused_mul_mat_gguf(x, w, qtype)
                    if shards:
                        starts, ends, widths, qtypes = (list(column) for column in zip(*shards, strict=True))
                        vgguf._fused_mul_mat_gguf_merged(
                            torch.empty(m, HIDDEN, dtype=torch.float16), padded, starts, ends, widths, qtypes)
            if by_table:
                with rec.in_scenario(f"TP{tp} GGUF linears x{m} (kernel table)"), virtual_device(target):
                    for w, qtype in by_table:
                        x = torch.empty(m, w.shape[1] // GGUF_BYTES[qtype] * 256, dtype=torch.float16)
                        gt.gguf_linear(x, w, qtype)
            ids = torch.stack([torch.randperm(EXPERTS)[:TOPK] for _ in range(m)]).to(torch.int32)
            x, tw = torch.empty(m, HIDDEN, dtype=torch.float16), torch.empty(m, TOPK, dtype=torch.float32)
            if any(lo <= m <= hi for lo, hi in vgguf.TRITON_MOE_TOKENS):
                with rec.in_scenario(f"TP{tp} GGUF routed experts x{m}"), virtual_device(target):
                    vgguf._fused_moe_gguf(x, w13, w2, tw, ids, GGUF_Q4_K, GGUF_Q5_K, "silu")
            else:
                with rec.in_scenario(f"TP{tp} GGUF routed experts x{m} (kernel table)"), virtual_device(target):
                    gt.gguf_moe(x, w13, w2, tw, ids, GGUF_Q4_K, GGUF_Q5_K)
    finally:
        vgguf.GGUF_KERNELS = saved


def trace_all(
    target: Target, *, dense: bool = True, tps: tuple[int, ...] = TPS, gguf_tps: tuple[int, ...] = GGUF_TPS
) -> Recorder:
    """Every scenario at every TP of tps (the GGUF kernels at those of gguf_tps); the
    caller has put the patched vLLM on sys.path."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    # vLLM's op registrations import on the no-device platform (a CUDA one would
    # need vllm._C, i.e. libcuda); the modules traced import on the virtual CUDA
    # platform, taking their CUDA-side import-time branches as on the host
    import vllm._custom_ops  # noqa: F401

    install_vllm_platform(target)
    # the sampler binds HAS_TRITON at import: import it after the platform
    rec = Recorder()
    with recording(rec), recording_ops(rec):
        trace_model_runner(rec, target)
        trace_sampler(rec, target)
        for tp in tps:
            trace_sparse(rec, target, tp)
            if dense:
                trace_dense(rec, target, tp)
        for tp in gguf_tps:
            trace_gguf(rec, target, tp)
    return rec
