"""Stage 5: MLA attention, the implementation under test against plain PyTorch MLA.

On a GPU (each one in turn) the implementations under test are vLLM's own code paths of
the Triton MLA backend, called through their real methods with only the surrounding
object stubbed:
  * decode: TritonMLAImpl.forward_mqa -> triton_decode_attention.decode_attention_fwd
    (paged latent cache, several KV splits), compared in latent space and after W_UV;
  * prefill: MLACommonImpl.forward_mha with FlashAttention (vllm_flash_attn) -
    new tokens only, and with chunked context (gather_and_maybe_dequant_cache over a
    small workspace so the context is split in several chunks, merged by
    merge_attn_states) - once with FA2 and V zero-padded to the QK head dim (the path an
    RTX PRO 6000, SM 12.0, takes) and, where it runs (Hopper), with FA3 unpadded.
Without a GPU (CI) the implementation under test is this package's absorbed (latent)
form against the expanded form: that proves the reference and the fault detection, not
vLLM's kernels; the `where` column says which ran.
"""

from __future__ import annotations

import functools
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

from glm5_tools.diagnostics import mla_reference as ref
from glm5_tools.diagnostics.dims import MLADims
from glm5_tools.diagnostics.result import StageResult

STAGE = 5
NAME = "mla attention"
# max |impl - reference| / max |reference|. Inputs are bfloat16 (the serving dtype); the
# reference runs in float32 on the same rounded inputs. One bfloat16 rounding of the
# output is 2^-8 = 3.9e-3 relative; the kernels also keep bf16 intermediates (P, the
# up-projection), so a correct path lands at ~1e-2 or below. A wrong softmax scale, a
# wrong head slice or a dropped rope part moves the output by 10-100 % of its range.
TOLERANCE = 3e-2

CASE_SEQ_LENS = (1, 37, 530, 2100)  # decode: 2100 > 4 x 512, several KV splits
PREFILL = ((0, 23), (150, 40), (333, 7))  # (context, new tokens) per request
PAGE = 64
CHUNK = 128  # chunked-context workspace per request: 333 context tokens -> 3 chunks


@dataclass
class Weights:
    w_uk: torch.Tensor  # [H, nope, lora]
    w_uv: torch.Tensor  # [H, v, lora]

    @property
    def kv_b(self) -> torch.Tensor:  # [H*(nope+v), lora], vLLM's kv_b_proj layout
        return torch.cat([self.w_uk, self.w_uv], dim=1).reshape(-1, self.w_uk.shape[-1])


def make_weights(d: MLADims, device: str, dtype: torch.dtype, seed: int) -> Weights:
    g = torch.Generator(device="cpu").manual_seed(seed)
    std = d.kv_lora_rank ** -0.5
    # chosen so q.k over the qk head dim has a spread of a few units after scaling:
    # attention is neither uniform nor one-hot, so a wrong scale shows
    w_uk = torch.randn(d.num_heads, d.qk_nope_head_dim, d.kv_lora_rank, generator=g) * std * 2
    w_uv = torch.randn(d.num_heads, d.v_head_dim, d.kv_lora_rank, generator=g) * std
    return Weights(w_uk.to(device, dtype), w_uv.to(device, dtype))


def make_inputs(d: MLADims, seq: int, queries: int, device: str, dtype: torch.dtype,
                seed: int) -> ref.MLAInputs:
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = d.num_heads
    return ref.MLAInputs(
        kv_c=torch.randn(seq, d.kv_lora_rank, generator=g).to(device, dtype),
        k_pe=torch.randn(seq, d.qk_rope_head_dim, generator=g).to(device, dtype),
        q_nope=torch.randn(queries, h, d.qk_nope_head_dim, generator=g).to(device, dtype),
        q_pe=torch.randn(queries, h, d.qk_rope_head_dim, generator=g).to(device, dtype),
    )


Check = tuple[str, float]


# ----------------------------------------------------------------------------- CPU
def cpu_checks(d: MLADims, scale_under_test: float | None = None) -> list[Check]:
    """Absorbed form (under test) vs expanded form, decode and chunk-free prefill."""
    scale = d.softmax_scale
    test_scale = scale if scale_under_test is None else scale_under_test
    w = make_weights(d, "cpu", torch.bfloat16, 0)
    out: list[Check] = []
    for i, seq in enumerate(CASE_SEQ_LENS[:3]):
        x = make_inputs(d, seq, 1, "cpu", torch.bfloat16, 10 + i)
        out.append((f"decode seq {seq} (absorbed vs expanded)",
                    ref.rel_err(ref.absorbed(x, w.w_uk, w.w_uv, test_scale),
                                ref.expanded(x, w.w_uk, w.w_uv, scale))))
    for i, (ctx, new) in enumerate(PREFILL):
        x = make_inputs(d, ctx + new, new, "cpu", torch.bfloat16, 20 + i)
        out.append((f"prefill ctx {ctx} + {new} (absorbed vs expanded)",
                    ref.rel_err(ref.absorbed(x, w.w_uk, w.w_uv, test_scale),
                                ref.expanded(x, w.w_uk, w.w_uv, scale))))
    return out


# ----------------------------------------------------------------------------- GPU
class _KvB(torch.nn.Module):  # type: ignore[misc]
    """kv_b_proj as MLA calls it: returns (x @ W^T,), has .weight."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.linear(x, self.weight),)


def _paged(seqs: list[torch.Tensor], device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent+rope rows of each sequence into a shuffled paged cache and its block table."""
    blocks = [math.ceil(s.shape[0] / PAGE) for s in seqs]
    total = sum(blocks) + 3
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(total, generator=g)
    width = seqs[0].shape[1]
    cache = torch.randn(total, PAGE, width, generator=g).to(device, seqs[0].dtype) * 100
    table = torch.zeros(len(seqs), max(blocks), dtype=torch.int32)
    at = 0
    for i, s in enumerate(seqs):
        for b in range(blocks[i]):
            phys = int(perm[at])
            at += 1
            table[i, b] = phys
            rows = s[b * PAGE:(b + 1) * PAGE]
            cache[phys, : rows.shape[0]] = rows
    return cache, table.to(device)


def vllm_decode_check(d: MLADims, device: str, scale: float) -> list[Check]:
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAImpl

    dt = torch.bfloat16
    w = make_weights(d, device, dt, 1)
    xs = [make_inputs(d, s, 1, device, dt, 100 + i) for i, s in enumerate(CASE_SEQ_LENS)]
    cache, table = _paged([torch.cat([x.kv_c, x.k_pe], dim=1) for x in xs], device, 7)
    ql = torch.cat([ref.absorb_query(x.q_nope, w.w_uk) for x in xs]).to(dt)  # [B, H, lora]
    qpe = torch.cat([x.q_pe for x in xs])
    stub = SimpleNamespace(kv_lora_rank=d.kv_lora_rank, scale=scale,
                           _sm_count=torch.cuda.get_device_properties(device).multi_processor_count)
    seq_lens = torch.tensor(CASE_SEQ_LENS, dtype=torch.int32, device=device)
    meta = SimpleNamespace(decode=SimpleNamespace(block_table=table, seq_lens=seq_lens),
                           max_seq_len=max(CASE_SEQ_LENS))
    layer = SimpleNamespace(_k_scale=torch.tensor(1.0, dtype=torch.float32, device=device))
    o, _ = TritonMLAImpl.forward_mqa(stub, (ql, qpe), cache, meta, layer)
    torch.cuda.synchronize(device)
    out: list[Check] = []
    for i, x in enumerate(xs):
        # the reference gets the same bf16-rounded latent query the kernel got
        lat = _latent_with_query(x, ql[i: i + 1], d.softmax_scale)
        out.append((f"triton decode seq {x.seq_len} latent", ref.rel_err(o[i: i + 1], lat)))
        up = torch.einsum("thc,hvc->thv", o[i: i + 1].float(), w.w_uv.float())
        out.append((f"triton decode seq {x.seq_len} after W_UV vs expanded",
                    ref.rel_err(up, ref.expanded(x, w.w_uk, w.w_uv, d.softmax_scale))))
    return out


def _latent_with_query(x: ref.MLAInputs, ql: torch.Tensor, scale: float) -> torch.Tensor:
    c, pe = x.kv_c.float(), x.k_pe.float()
    s = torch.einsum("thc,lc->htl", ql.float(), c) + torch.einsum("thr,lr->htl",
                                                                  x.q_pe.float(), pe)
    return torch.einsum("htl,lc->thc", torch.softmax(s * scale, dim=-1), c)


def _prefill_harness(fa_version: int, pad_v: bool) -> type:
    from vllm.model_executor.layers.attention.mla_attention import MLACommonImpl

    class Harness:  # only the methods forward_mha reaches, taken from vLLM unchanged
        forward_mha = MLACommonImpl.forward_mha
        _compute_prefill_context = MLACommonImpl._compute_prefill_context
        _concat_k_nope_k_pe = MLACommonImpl._concat_k_nope_k_pe
        _flash_attn_varlen_diff_headdims = MLACommonImpl._flash_attn_varlen_diff_headdims
        _run_prefill_new_tokens = MLACommonImpl._run_prefill_new_tokens_fa
        _run_prefill_context_chunk = MLACommonImpl._run_prefill_context_chunk_fa

    Harness.fa_version = fa_version  # type: ignore[attr-defined]
    Harness._pad_v = pad_v  # type: ignore[attr-defined]
    return Harness


def vllm_prefill_check(d: MLADims, device: str, scale: float, fa_version: int, pad_v: bool,
                       with_context: bool) -> list[Check]:
    from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    dt = torch.bfloat16
    reqs = PREFILL if with_context else tuple((0, n) for _, n in PREFILL)
    w = make_weights(d, device, dt, 2)
    xs = [make_inputs(d, c + n, n, device, dt, 200 + i) for i, (c, n) in enumerate(reqs)]
    harness = _prefill_harness(fa_version, pad_v)()
    harness.dcp_world_size = 1
    harness.kv_b_proj = _KvB(w.kv_b)
    harness.num_heads = d.num_heads
    harness.qk_nope_head_dim = d.qk_nope_head_dim
    harness.v_head_dim = d.v_head_dim
    harness.kv_lora_rank = d.kv_lora_rank
    harness.kv_cache_dtype = "auto"
    harness._use_flashinfer_concat_mla_k = False
    harness.scale = scale
    harness.vllm_flash_attn_version = fa_version
    harness.flash_attn_varlen_func = functools.partial(flash_attn_varlen_func,
                                                       fa_version=fa_version)
    new = [n for _, n in reqs]
    q = torch.cat([torch.cat([x.q_nope, x.q_pe], dim=-1) for x in xs])  # [T, H, qk]
    kv_c = torch.cat([x.kv_c[c:] for x, (c, _) in zip(xs, reqs, strict=True)])
    k_pe = torch.cat([x.k_pe[c:] for x, (c, _) in zip(xs, reqs, strict=True)]).unsqueeze(1)
    qsl = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32,
                       device=device)
    cache, table = _paged([torch.cat([x.kv_c, x.k_pe], dim=1) for x in xs], device, 8)
    chunked = None
    if with_context:
        ctx = torch.tensor([c for c, _ in reqs], dtype=torch.int32)
        n_chunks = math.ceil(int(ctx.max()) / CHUNK)
        starts = (torch.arange(n_chunks, dtype=torch.int32)[:, None]
                  .expand(-1, len(reqs)) * CHUNK)
        lens = (torch.minimum(ctx[None], starts + CHUNK) - starts).clamp(min=0)
        cu = torch.zeros(n_chunks, len(reqs) + 1, dtype=torch.int32)
        cu[:, 1:] = lens.cumsum(1)
        tot = cu[:, -1]
        t2s = torch.zeros(n_chunks, int(tot.max()), dtype=torch.int32)
        for i in range(n_chunks):
            s = torch.repeat_interleave(torch.arange(len(reqs), dtype=torch.int32), lens[i])
            t2s[i, : s.shape[0]] = s
        chunked = MLACommonPrefillMetadata.ChunkedContextMetadata(
            cu_seq_lens=cu.to(device), starts=starts.contiguous().to(device),
            seq_tot=lens.sum(1).tolist(), max_seq_lens=lens.max(1).values.tolist(),
            seq_lens=lens, workspace=torch.empty(CHUNK * len(reqs), cache.shape[-1],
                                                 dtype=dt, device=device),
            token_to_seq=t2s.to(device), chunk_total_token=tot.tolist())
    prefill = MLACommonPrefillMetadata(block_table=table, query_start_loc=qsl,
                                       max_query_len=max(new), chunked_context=chunked,
                                       q_data_type=dt)
    meta = SimpleNamespace(prefill=prefill, num_prefills=len(reqs))
    output = torch.empty(q.shape[0], d.num_heads * d.v_head_dim, dtype=dt, device=device)
    k_scale = torch.tensor(1.0, dtype=torch.float32, device=device)
    harness.forward_mha(q, kv_c, k_pe, cache, meta, k_scale, output)
    torch.cuda.synchronize(device)
    got = output.view(-1, d.num_heads, d.v_head_dim)
    label = (f"prefill FA{fa_version}{' V padded to qk dim' if pad_v else ''} "
             f"{'chunked context' if with_context else 'new tokens only'}")
    outs: list[Check] = []
    at = 0
    for x, (c, n) in zip(xs, reqs, strict=True):
        want = ref.expanded(x, w.w_uk, w.w_uv, d.softmax_scale)
        outs.append((f"{label} ctx {c} + {n}", ref.rel_err(got[at: at + n], want)))
        at += n
    return outs


def gpu_checks(d: MLADims, device: str, scale_under_test: float | None = None,
               fa3: bool = True) -> list[Check]:
    scale = d.softmax_scale if scale_under_test is None else scale_under_test
    checks: list[Check] = []
    runs: list[tuple[str, Callable[[], list[Check]]]] = [
        ("triton decode", lambda: vllm_decode_check(d, device, scale)),
    ]
    major = torch.cuda.get_device_capability(device)[0]
    for ctx in (False, True):
        runs.append((f"FA2 padded ctx={ctx}",
                     functools.partial(vllm_prefill_check, d, device, scale, 2, True, ctx)))
        if major == 9 and fa3:
            runs.append((f"FA3 ctx={ctx}",
                         functools.partial(vllm_prefill_check, d, device, scale, 3, False, ctx)))
    for label, fn in runs:
        try:
            checks.extend(fn())
        except Exception as exc:  # a path that cannot run is a failure, with its reason
            tb = traceback.format_exc().strip().splitlines()[-3:]
            checks.append((f"{label}: {type(exc).__name__}: {exc} | {' / '.join(tb)}",
                           float("nan")))
    return checks


def dims_variants(d: MLADims) -> list[tuple[str, MLADims]]:
    """The deployed per-rank dims; and, when V already equals the QK head dim there
    (GLM-5: 192+64 = 256 = v), a variant with a smaller V so the zero-padding of V
    really pads."""
    out = [("deployed", d)]
    if d.v_head_dim >= d.qk_head_dim:
        out.append(("v<qk variant FA2 only", replace(d, v_head_dim=d.qk_head_dim // 2)))
    return out


def run_stage(d_rank: MLADims, device: str, scale_under_test: float | None = None,
              devices: list[str] | None = None) -> StageResult:
    details = [f"per-rank dims: {d_rank.num_heads} heads, kv_lora_rank {d_rank.kv_lora_rank}, "
               f"qk_nope {d_rank.qk_nope_head_dim}, rope {d_rank.qk_rope_head_dim}, "
               f"v {d_rank.v_head_dim}, softmax scale {d_rank.softmax_scale:.6g}"]
    worst = 0.0
    if device == "cpu":
        where = "cpu: absorbed vs expanded PyTorch (not vLLM's kernels)"
        checks = [(f"[cpu] {n}", e) for n, e in cpu_checks(d_rank, scale_under_test)]
    else:
        devs = devices or [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        where = f"gpu x{len(devs)}: vLLM triton decode + FA prefill ({torch.cuda.get_device_name(0)})"
        checks = []
        for dev in devs:
            with torch.cuda.device(dev):
                for vname, dims in dims_variants(d_rank):
                    # the variant exists to exercise the zero-padding of V (FA2, the
                    # SM 12.0 path); FA3 has no kernel for qk 256 with v 128
                    checks.extend((f"[{dev} {vname}] {n}", e)
                                  for n, e in gpu_checks(dims, dev, scale_under_test,
                                                         fa3=vname == "deployed"))
    for name, err in checks:
        details.append(f"{name}: rel err {err:.3e}")
        worst = float("nan") if math.isnan(err) or math.isnan(worst) else max(worst, err)
    return StageResult.judge(STAGE, NAME, worst, TOLERANCE, where, details)


def describe(d: MLADims) -> dict[str, Any]:
    return {"heads": d.num_heads, "kv_lora_rank": d.kv_lora_rank}
