"""Stage 8: vLLM's own forward pass of the GGUF on the CPU against llama.cpp, layer by layer.

The whole model as ``vllm serve`` builds it (``vllm_forward``: vLLM's GGUF loader and patch
set, ``GlmMoeDsaForCausalLM``, ``FusedMoE`` with its real router, the attention backend's
own code in Triton's interpreter, CPU stand-ins only for CUDA-only ops) runs seeded prompts;
its logits at every position are compared with llama.cpp's ``glm-dsa`` on the same file
(top-1 agreement, mean KL), and its per-layer values, taken by hooks on vLLM's modules,
with this project's float32 reference of the same GGUF (``dsa_reference``, itself checked
against llama.cpp by stage 7 and its tests). A failure names the first layer and sub-block
that diverges, in the order the layer computes them:

    attn_norm, attention, ffn_norm, [MoE: router (expert choice, then weights),
    routed experts, shared expert], mlp, out (the residual stream after the layer)

Backends: ``TRITON_MLA`` (dense, patch 0004: every position as a decode of the Triton MQA
kernel; the reference attends every earlier token) and ``TRITON_MLA_SPARSE`` (patch 0011:
one prefill through the Triton indexer and sparse MLA; the reference is the sparse one
with vLLM's fp8 indexer rounding, ``attention="sparse-fp8"``).

Skipped for a GGUF over ``MAX_GGUF_BYTES`` (a float32 CPU forward of the whole model, and
Triton's interpreter), without vLLM or without llama.cpp's bindings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from glm5_tools.diagnostics.dsa_reference import Agreement, GlmDsaReference, agreement, rms_norm
from glm5_tools.diagnostics.gguf_io import gguf_files
from glm5_tools.diagnostics.result import StageResult, Verdict

STAGE = 8
NAME = "vllm forward vs llama.cpp"
MAX_GGUF_BYTES = 2 * 1024**3

# Sub-blocks in the order a layer computes them; the first over its tolerance is named.
# Relative error: max |vllm - ref| / max |ref| over the prompt's tokens, the reference's
# sub-block fed vLLM's own input to it. Both sides are CPU float32 from the same gguf-py
# dequantization: clean, every float32 sub-block measured <= 1e-6 (docs/diagnostics.md).
# vLLM's router computes its logits in bfloat16 (GateLinear out_dtype, also on the GPU),
# so the routing weights and what they weigh carry one bfloat16 rounding (2^-8 = 3.9e-3;
# measured <= 6e-3): their bound is 2e-2.
FLOAT32_TOLERANCE = 1e-4
ROUTED_TOLERANCE = 2e-2
# The indexer's top-k: vLLM's selection must be the reference's (same fp8 rounding) except
# at ties (keys whose reference scores are within SELECTION_TIE, relative); measured: equal.
SELECTION_TIE = 1e-5
# bfloat16 (the fp8 latent cache's run): the indexer's projections and their inputs are
# bfloat16, which moves a score by up to 2.5e-2 of its row's largest score (measured, tiny
# top-k-32 fixture, 80 tokens: 15 of 80 x 4 selections flipped there, none by more): keys
# within 5e-2 of the row's largest score from the k-th are a tie.
SELECTION_TIE_BF16 = 5e-2
TOLERANCES = {"attn_norm": FLOAT32_TOLERANCE, "selection": 0.0, "order": 0.0, "attn": FLOAT32_TOLERANCE,
              "ffn_norm": FLOAT32_TOLERANCE,
              "router": ROUTED_TOLERANCE, "routed": ROUTED_TOLERANCE, "shared": FLOAT32_TOLERANCE,
              "mlp": ROUTED_TOLERANCE, "out": FLOAT32_TOLERANCE}
SUBBLOCKS = ("attn_norm", "selection", "order", "attn", "ffn_norm", "router", "routed", "shared", "mlp", "out")
LABELS = {
    "attn_norm": "attention input norm (attn_norm)",
    "selection": "sparse attention top-k selection (indexer)",
    "order": "top-k selection order (positions ascending, -1 last: 0011's sort after persistent_topk)",
    "attn": "attention (MLA, after o_proj)",
    "ffn_norm": "ffn input norm (ffn_norm)",
    "router": "router",
    "routed": "routed experts (weighted, scaled sum)",
    "shared": "shared expert",
    "mlp": "mlp",
    "out": "residual stream after the layer",
    "logits": "logits",
}
# A choice of experts may differ from the reference only at a tie that vLLM's bfloat16
# router logits can flip: expert j (chosen by vLLM only) scores, in the reference, within
# ROUTER_TIE * (|logit_j| + |logit_e|) of e, the reference's lowest chosen expert (one
# bfloat16 rounding moves a logit by <= 2^-9 of it and sigmoid' <= 1/4: 2^-11 each). The
# fixture's e_score_correction_bias is ~1e-2 and the choices it decides are 2e-3 to 4e-3
# apart: a looser bound (2^-9 * max |logit| measured) excused the fault that ignores it.
ROUTER_TIE = 2.0**-11
# bfloat16: vLLM routes by its bfloat16 router logits (the reference then routes by the same
# logits) and computes the choice scores in bfloat16 too: experts whose choice scores are
# within ROUTER_TIE_BF16 of each other, relative, are a tie (measured flips up to 2.8e-3).
ROUTER_TIE_BF16 = 2.0**-7

# Logits against llama.cpp (every position): llama.cpp quantizes activations to 8 bits for
# its K-quant matmuls and keeps f16 caches. Clean, vLLM measured KL <= 0.0114 and top-1
# >= 0.906 on the tiny fixtures, equal to the float32 reference's own (docs/diagnostics.md);
# stage 7's bound for that spread is 0.03. The per-layer checks are the precise ones.
KL_TOLERANCE = 0.03
TOP1_MIN = 0.8
# With the fp8_ds_mla latent cache (the model in bfloat16, as a GPU runs it) the logits carry
# the cache's e4m3 rounding and bfloat16 arithmetic besides llama.cpp's own: the H100 served
# the tiny top-k-32 fixture with this cache at KL 0.019-0.031 and top-1 0.75-0.85 from llama.cpp
# past index_topk (the bf16 cache 0.023-0.032; docs/validation/e2e-gpu/fp8), the float32
# reference with the cache's rounding at 0.019-0.028. Stage 8 measured 0.0064 / 0.0082, top-1
# 0.917 / 0.900 on its 24- and 80-token prompts. Bounds: KL 0.05, top-1 0.7.
KL_TOLERANCE_FP8 = 0.05
TOP1_MIN_FP8 = 0.7
# bfloat16 (the fp8 cache's run, as a GPU runs it): each sub-block computed in bfloat16 from
# bfloat16 inputs, against the float32 reference (latent rounded as the fp8_ds_mla cache
# keeps it) fed the same inputs. Measured (tiny top-k-32 fixture, 24 and 80 tokens): norms,
# mlp, experts and the residual <= 8.3e-3 (about two bfloat16 roundings), the attention <=
# 2.2e-2 (its latent is rounded to e4m3 from vLLM's own bfloat16 c: a bfloat16 step apart,
# an element can land one e4m3 step, 6-12 %, away). Bounds: 3e-2 and 6e-2.
BF16_TOLERANCES = {**{k: 3e-2 for k in TOLERANCES}, "attn": 6e-2, "selection": 0.0, "order": 0.0}

# Stage 8's default prompt lengths: one within a cache page and the small fixture's top-k,
# one past both (two pages of the caches, the top-k boundary and the page boundary inside
# the compared positions).
LENGTHS = (24, 80)
# The decode step of the longest prompt: its last DECODE_ROWS positions as one-token requests
# over the prefill's caches (one more than 0011's rank-sort rows: its bitonic sort runs).
# Its logits are those of the prefill's rows, from the same cached keys: measured rel 5.6e-7
# (float32); in bfloat16 (the fp8 cache's run) 4.1e-3 and 3.8e-2 on two 80-token prompts (the
# decode and the prefill paths round differently, and a bfloat16 tie in the indexer can
# select another key), hence 1e-1 there: the float32 run is the precise check of this path.
DECODE_ROWS = 5
DECODE_TOLERANCE = 1e-4
DECODE_TOLERANCE_BF16 = 1e-1

LlamaLogits = Callable[[Path, list[int]], torch.Tensor]


@dataclass(frozen=True)
class Divergence:
    layer: int
    block: str
    measured: float
    detail: str

    def describe(self) -> str:
        if self.layer < 0:
            return f"{LABELS[self.block]}: {self.detail}"
        return f"layer {self.layer} {LABELS[self.block]}: {self.detail}"


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-12))


def _router(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], bf16: bool = False) -> tuple[float, str]:
    """Expert choice (sets per token, ties excepted) and then the weights of the same
    experts: (measure, detail); measure inf for a choice that differs."""
    gid, wid = got["topk_ids"].long(), want["topk_ids"].long()
    choice, logits = want["choice_scores"], want["router_logits"]
    bad = []
    for t in range(wid.shape[0]):
        mine, ref = set(gid[t].tolist()), set(wid[t].tolist())
        if mine == ref:
            continue
        # a tie: every expert only vLLM chose scores (in the reference) within what one
        # bfloat16 rounding of the router logits can move, of the reference's k-th
        ref_ids = sorted(ref)
        e = ref_ids[int(choice[t, ref_ids].argmin())]
        edge = float(choice[t, e])
        if bf16:
            far = any(edge - float(choice[t, j]) > ROUTER_TIE_BF16 * abs(edge) for j in mine - ref)
        else:
            far = any(edge - float(choice[t, j]) > ROUTER_TIE * (abs(float(logits[t, j])) + abs(float(logits[t, e])))
                      for j in mine - ref)
        if far:
            bad.append(t)
    if bad:
        t = bad[0]
        return float("inf"), (f"expert choice differs at {len(bad)} of {wid.shape[0]} tokens (token {t}: "
                              f"vLLM {sorted(gid[t].tolist())}, reference {sorted(wid[t].tolist())})")
    gw = got["topk_weights"].gather(1, gid.argsort(1))
    ww = want["topk_weights"].gather(1, wid.argsort(1))
    same = torch.tensor([set(gid[t].tolist()) == set(wid[t].tolist()) for t in range(wid.shape[0])])
    err = _rel(gw[same], ww[same]) if bool(same.any()) else 0.0
    return err, f"expert choice equal, weights rel err {err:.3g}"


def _selection(got: torch.Tensor, chosen: torch.Tensor, scores: torch.Tensor | None, tie_rel: float = SELECTION_TIE
               ) -> tuple[float, str, torch.Tensor]:
    """vLLM's top-k (request-local positions, -1 for none) against the reference's
    selection of the same scores: (fraction of tokens whose selection differs beyond a tie,
    detail, the tokens whose selections are equal)."""
    t = chosen.shape[0]
    equal = torch.zeros(t, dtype=torch.bool)
    bad = []
    for i in range(t):
        mine = {int(j) for j in got[i].tolist() if j >= 0}
        want = set(torch.nonzero(chosen[i]).squeeze(1).tolist())
        if mine == want:
            equal[i] = True
            continue
        tie = False
        if scores is not None and len(mine) == len(want):
            s = scores[i]
            edge = min(float(s[j]) for j in want)
            # float32: within tie_rel of the k-th score; bfloat16: of the row's largest score
            scale = max(1.0, abs(edge)) if tie_rel <= SELECTION_TIE else float(s[torch.isfinite(s)].abs().max())
            tie = all(abs(float(s[j]) - edge) <= tie_rel * scale for j in mine ^ want)
        if not tie:
            bad.append(i)
    if bad:
        i = bad[0]
        got_i = {int(j) for j in got[i].tolist() if j >= 0}
        want_i = set(torch.nonzero(chosen[i]).squeeze(1).tolist())
        only_v, only_r = sorted(got_i - want_i), sorted(want_i - got_i)
        return (len(bad) / t, f"top-k selection differs at {len(bad)} of {t} tokens (token {i}: only vLLM "
                f"{only_v[:6]}, only reference {only_r[:6]}; {len(got_i)} vs {len(want_i)} keys)", equal)
    return 0.0, f"top-k selection equal at {int(equal.sum())} of {t} tokens (the rest ties)", equal


def _order(got: torch.Tensor) -> tuple[float, str]:
    """Each row of vLLM's top-k buffer [T, k] must list its positions ascending, then -1
    (0011's order on both of its paths: the torch top-k lists them so, and after
    persistent_topk, which returns its rows in any order, its sort kernels put them so; the
    sparse MLA kernel sums in this order, so it is what makes a request repeatable):
    (fraction of rows out of order, detail)."""
    r = got.long()
    valid = r >= 0
    prefix = (valid[:, 1:] <= valid[:, :-1]).all(1)  # no position after a -1
    pads = ((r == -1) | valid).all(1)  # "none" is -1 only
    ascending = (~(valid[:, 1:] & valid[:, :-1]) | (r[:, 1:] > r[:, :-1])).all(1)
    bad = (~(prefix & pads & ascending)).nonzero().squeeze(1).tolist()
    if bad:
        i = bad[0]
        return (len(bad) / r.shape[0], f"selection rows out of order at {len(bad)} of {r.shape[0]} tokens (token {i} "
                f"starts {r[i, :6].tolist()}, {int(valid[i].sum())} positions in a row of {r.shape[1]})")
    return 0.0, f"{r.shape[0]} rows ascending, -1 last"


def _check(block: str, got: dict[str, torch.Tensor], want: torch.Tensor) -> tuple[float, str]:
    if block not in got:
        return float("inf"), "not tapped in vLLM"
    err = _rel(got[block], want)
    return err, f"rel err {err:.3g}"


def compare_layers(got: list[dict[str, torch.Tensor]], ref: GlmDsaReference, tokens: list[int],
                   attention: str, embedding: torch.Tensor | None = None,
                   tolerances: dict[str, float] | None = None
                   ) -> tuple[float, list[str], Divergence | None]:
    """Each sub-block of each layer of vLLM against the reference's same sub-block fed
    vLLM's own input to it (so that an error is charged to the sub-block that makes it,
    not to every later one): (worst error relative to the block's tolerance, one line per
    layer, the first divergence in computing order)."""
    hp = ref.hp
    if len(got) != hp.n_layer:
        raise ValueError(f"vLLM ran {len(got)} layers, the GGUF has {hp.n_layer}")
    x = ref.w("token_embd.weight")[torch.tensor(tokens, dtype=torch.long)] if embedding is None else embedding
    worst, lines, first = 0.0, [], None
    for i, g in enumerate(got):
        p = f"blk.{i}"
        results: list[tuple[str, float, str]] = []
        with torch.no_grad():
            results.append(("attn_norm", *_check("attn_norm", g, rms_norm(x, ref.w(f"{p}.attn_norm.weight"),
                                                                          hp.rms_eps))))
            a_in = g.get("attn_norm", x)
            ref_attn, trace = ref._attention(a_in, i, attention, "none")  # type: ignore[arg-type]
            rows = torch.ones(len(tokens), dtype=torch.bool)
            if attention != "dense":
                if "topk_indices" not in g:
                    results.append(("selection", float("inf"), "vLLM's indexer was not called"))
                else:
                    measured, detail, rows = _selection(
                        g["topk_indices"], trace.chosen, trace.scores,
                        SELECTION_TIE_BF16 if tolerances is BF16_TOLERANCES else SELECTION_TIE)
                    results.append(("selection", measured, detail))
                    results.append(("order", *_order(g["topk_indices"])))
            if "attn" in g and bool(rows.any()):
                err = _rel(g["attn"][rows], ref_attn[rows])
                results.append(("attn", err, f"rel err {err:.3g}"))
            else:
                results.append(("attn", *_check("attn", g, ref_attn)))
            mid = x + g.get("attn", ref_attn)
            results.append(("ffn_norm", *_check("ffn_norm", g, rms_norm(mid, ref.w(f"{p}.ffn_norm.weight"),
                                                                       hp.rms_eps))))
            h = g.get("ffn_norm", mid)
            mlp_rows = torch.ones(len(tokens), dtype=torch.bool)
            if i < hp.n_dense:
                ref_mlp = ref._ffn(h, p)
            else:
                tap: dict[str, torch.Tensor] = {}
                # bfloat16: the reference routes by vLLM's own router logits (their bfloat16
                # weights and products move near-tied choices; the logits are checked apart)
                own = "router_logits" in g and tolerances is not None and tolerances is BF16_TOLERANCES
                ref_mlp = ref._moe(h, i, tap, router_logits=g["router_logits"] if own else None)
                if "topk_ids" not in g:
                    results.append(("router", float("inf"), "vLLM's router was not called"))
                else:
                    measured, detail = _router(g, tap, bf16=own)
                    if own:
                        lg = _rel(g["router_logits"], h.float() @ ref.w(f"{p}.ffn_gate_inp.weight").T)
                        measured, detail = max(measured, lg), f"{detail}; logits rel err {lg:.3g}"
                    results.append(("router", measured, detail))
                    same = torch.tensor([set(a.tolist()) == set(b.tolist())
                                         for a, b in zip(g["topk_ids"], tap["topk_ids"], strict=True)])
                    mlp_rows = same  # a token routed differently at a tie: its mlp is another sum
                    for block in ("routed", "shared"):
                        if block not in g:
                            results.append((block, float("inf"), "not tapped in vLLM"))
                        elif bool(same.any()):
                            err = _rel(g[block][same], tap[block][same])
                            results.append((block, err, f"rel err {err:.3g}"))
            if "mlp" in g and bool(mlp_rows.any()):
                err = _rel(g["mlp"][mlp_rows], ref_mlp[mlp_rows])
                results.append(("mlp", err, f"rel err {err:.3g}"))
            else:
                results.append(("mlp", *_check("mlp", g, ref_mlp)))
            out = mid + g.get("mlp", ref_mlp)
            results.append(("out", *_check("out", g, out)))
        parts = []
        for block, measured, detail in results:
            tol = (tolerances or TOLERANCES)[block]
            parts.append(f"{block} {measured:.2e}")
            worst = max(worst, measured / tol if tol > 0 else (0.0 if measured == 0 else float("inf")))
            if first is None and not measured <= tol:
                first = Divergence(i, block, measured, f"{detail} (tolerance {tol:g})")
        lines.append(f"layer {i}: " + ", ".join(parts))
        x = g.get("out", out)
    return worst, lines, first


def prompt_tokens(n: int, seed: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, n)]


def llama_cpp_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits as logits

    return logits(path, tokens)


@dataclass
class DecodeReport:
    """The last DECODE_ROWS positions of a prompt as one decode step of as many one-token
    requests, against the prefill's rows: logits relative error, and per layer the decode
    rows' top-k selection (in order, and the prefill's set)."""

    rows: int
    path: str
    logits_rel: float
    first: Divergence | None
    lines: list[str]


@dataclass
class PromptReport:
    tokens: int
    agreement: Agreement  # vLLM vs llama.cpp, every position
    reference: Agreement  # the float32 reference vs llama.cpp (the spread of a correct model)
    layers_worst: float
    layer_lines: list[str]
    first: Divergence | None
    decode: DecodeReport | None = None


def _decode_check(model: object, tokens: list[int], prefill_logits: torch.Tensor,
                  prefill_layers: list[dict[str, torch.Tensor]], tolerance: float) -> DecodeReport:
    from glm5_tools.diagnostics.vllm_forward import _TOPK_SHUFFLE, Taps, VllmCpuModel

    assert isinstance(model, VllmCpuModel)
    rows = DECODE_ROWS
    calls = _TOPK_SHUFFLE.calls
    taps = Taps()
    got = model.decode_rows(tokens, rows, taps=taps)
    path = ("persistent_topk (its CPU stand-in: the exact set, shuffled) and 0011's sort kernels"
            if _TOPK_SHUFFLE.calls > calls else "0011's torch top-k")
    want = prefill_logits[-rows:, : got.shape[1]]
    rel = _rel(got[:, : want.shape[1]], want)
    first = None
    if not rel <= tolerance:
        first = Divergence(-1, "logits", rel, f"decode step logits rel err {rel:.3g} against the prefill's "
                           f"(tolerance {tolerance:g})")
    lines = [f"decode step of the last {rows} positions ({rows} one-token requests; top-k: {path}): logits rel "
             f"err {rel:.2e} against the prefill's"]
    for i, (g, p) in enumerate(zip(taps.layers, prefill_layers, strict=True)):
        if "topk_indices" not in g or "topk_indices" not in p:
            continue
        order, detail = _order(g["topk_indices"])
        mine = [{int(j) for j in r.tolist() if j >= 0} for r in g["topk_indices"]]
        theirs = [{int(j) for j in r.tolist() if j >= 0} for r in p["topk_indices"][-rows:]]
        differ = [k for k in range(rows) if mine[k] != theirs[k]]
        lines.append(f"  layer {i}: order {detail}; selection {'equal to' if not differ else 'differs from'} "
                     f"the prefill's" + (f" at rows {differ}" if differ else ""))
        if first is None and order > 0:
            first = Divergence(i, "order", order, f"decode step: {detail} (tolerance 0)")
        if first is None and differ:
            k = differ[0]
            first = Divergence(i, "selection", len(differ) / rows,
                               f"decode step: top-k selection differs from the prefill's at {len(differ)} of "
                               f"{rows} rows (row {k}: only decode {sorted(mine[k] - theirs[k])[:6]}, only "
                               f"prefill {sorted(theirs[k] - mine[k])[:6]})")
    return DecodeReport(rows, path, rel, first, lines)


def compare_prompt(model: object, ref: GlmDsaReference, gguf: Path, tokens: list[int],
                   llama: LlamaLogits, *, decode: bool = False) -> PromptReport:
    """The prompt's prefill (logits against llama.cpp, layers against the reference); with
    ``decode``, then its last DECODE_ROWS positions as a decode step (_decode_check)."""
    from glm5_tools.diagnostics.vllm_forward import Taps, VllmCpuModel

    assert isinstance(model, VllmCpuModel)
    float32 = model.dtype == torch.float32
    taps = Taps()
    got = model.forward(tokens, taps=taps)
    dec = _decode_check(model, tokens, got, taps.layers, DECODE_TOLERANCE if float32 else DECODE_TOLERANCE_BF16) \
        if decode else None
    attention = "dense" if model.backend == "TRITON_MLA" else "sparse-fp8"
    want = ref.forward(tokens, attention=attention).logits  # type: ignore[arg-type]
    lc = llama(gguf, tokens)
    worst, lines, first = compare_layers(taps.layers, ref, tokens, attention,
                                         tolerances=TOLERANCES if float32 else BF16_TOLERANCES)
    n = min(got.shape[1], lc.shape[1])
    return PromptReport(len(tokens), agreement(got[:, :n], lc[:, :n]), agreement(want[:, :n], lc[:, :n]),
                        worst, lines, first, dec)


def run_stage(gguf: Path, hf_dir: Path, *, backend: str = "TRITON_MLA_SPARSE", lengths: Sequence[int] = LENGTHS,
              seed: int = 0, llama: LlamaLogits | None = None, model: object | None = None,
              kv_cache_dtype: str = "auto") -> StageResult:
    """``model``: a VllmCpuModel already built from this GGUF with this backend and cache
    dtype (tests share one); by default the stage builds it. ``kv_cache_dtype`` "fp8": the
    sparse backend's fp8_ds_mla latent cache (``--kv-cache-dtype fp8``), the model in
    bfloat16 as on a GPU (that cache takes bf16 only), the reference's latent rounded as
    the cache keeps it."""
    from glm5_tools.diagnostics.vllm_forward import BACKENDS, BLOCK, KV_CACHE_DTYPES, PERSISTENT_TOPK_MAX_K

    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r}: stage 8 runs {', '.join(BACKENDS)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv cache dtype {kv_cache_dtype!r}: stage 8 runs {', '.join(KV_CACHE_DTYPES)}")
    fp8 = kv_cache_dtype == "fp8"
    if fp8 and backend != "TRITON_MLA_SPARSE":
        raise ValueError("--kv-cache-dtype fp8: the fp8_ds_mla latent cache is TRITON_MLA_SPARSE's (patch 0013)")
    name = f"{NAME} ({backend}{', fp8 latent cache' if fp8 else ''})"
    files = gguf_files(gguf)
    size = sum(f.stat().st_size for f in files)
    if size > MAX_GGUF_BYTES:
        return StageResult.skip(STAGE, name, f"GGUF of {size / 1024**3:.1f} GiB: a CPU forward of vLLM's "
                                f"model needs one of at most {MAX_GGUF_BYTES / 1024**3:.0f} GiB")
    if llama is None:
        from glm5_tools.diagnostics.stage_sparse import _llama_cpp_available

        why = _llama_cpp_available()
        if why:
            return StageResult.skip(STAGE, name, why)
        llama = llama_cpp_logits
    from glm5_tools.diagnostics.dsa_reference import latent_cache_rounding
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    first_file = files[0]
    ref = GlmDsaReference(first_file)
    if fp8:
        ref.latent_cache = latent_cache_rounding("fp8_ds_mla")
    if model is None:
        model = VllmCpuModel(first_file, hf_dir, backend, max_model_len=max(256, max(lengths) + 8),
                             dtype="bfloat16" if fp8 else "float32", kv_cache_dtype=kv_cache_dtype)
    if not isinstance(model, VllmCpuModel) or model.backend != backend or model.kv_cache_dtype != kv_cache_dtype:
        raise ValueError(f"the model given is not a VllmCpuModel with backend {backend} and kv cache {kv_cache_dtype}")
    kl_tolerance = KL_TOLERANCE_FP8 if fp8 else KL_TOLERANCE
    top1_min = TOP1_MIN_FP8 if fp8 else TOP1_MIN
    vocab = min(ref.n_vocab, int(model.model_config.hf_config.vocab_size))
    topk = ref.hp.index_topk
    # the decode step (and with it the persistent_topk path and 0011's sort kernels) on the
    # longest prompt, where the interpreter can afford the sort (vllm_forward)
    decode_at = max(lengths) if backend == "TRITON_MLA_SPARSE" and topk <= PERSISTENT_TOPK_MAX_K else None
    details: list[str] = []
    worst_kl, worst_top1_gap, first = 0.0, 0.0, None
    for i, n in enumerate(lengths):
        decode = n == decode_at and n > DECODE_ROWS
        decode_at = None if decode else decode_at
        rep = compare_prompt(model, ref, first_file, prompt_tokens(n, seed + i, vocab), llama, decode=decode)
        a, r = rep.agreement, rep.reference
        pages = (n + BLOCK - 1) // BLOCK
        details.append(f"prompt of {n} tokens ({pages} cache page{'s' if pages > 1 else ''} of {BLOCK}; index_topk "
                       f"{topk}{', passed' if n > topk else ''}): vLLM vs llama.cpp top-1 "
                       f"{a.top1:.3f}, KL mean {a.kl_mean:.4g} max {a.kl_max:.4g}; reference vs llama.cpp "
                       f"top-1 {r.top1:.3f}, KL {r.kl_mean:.4g}; layers worst error / tolerance {rep.layers_worst:.3g}")
        details.extend(f"  {line}" for line in rep.layer_lines)
        if rep.decode is not None:
            details.extend(f"  {line}" for line in rep.decode.lines)
        worst_kl = max(worst_kl, a.kl_mean)
        worst_top1_gap = max(worst_top1_gap, top1_min - a.top1)
        for div in (rep.first, rep.decode.first if rep.decode is not None else None):
            if div is not None and first is None:
                first = div
                details.append(f"  FIRST DIVERGENCE: {div.describe()}")
    if backend == "TRITON_MLA_SPARSE" and not any(n > max(topk, BLOCK) for n in lengths):
        details.append(f"note: no prompt is longer than both index_topk ({topk}) and one cache page ({BLOCK}): "
                       "the selection and the later pages of the caches are not checked")
    if backend == "TRITON_MLA_SPARSE" and topk > PERSISTENT_TOPK_MAX_K:
        details.append(f"note: index_topk {topk}: no decode step (Triton's interpreter would sort each row of "
                       f"{topk} positions for seconds); the top-k took 0011's torch path")
    where = (f"cpu: vLLM {backend}{' with the fp8_ds_mla latent cache, bfloat16' if fp8 else ''} (Triton "
             "interpreter), GGUF ops, cache writes and persistent_topk by CPU stand-ins; layers vs float32 "
             "reference, logits vs llama.cpp")
    failed = first is not None or worst_kl > kl_tolerance or worst_top1_gap > 0
    if first is not None:
        details.insert(0, f"first divergence: {first.describe()}")
    elif failed:
        details.insert(0, f"logits: KL {worst_kl:.4g} (tolerance {kl_tolerance}) or top-1 below {top1_min}")
    return StageResult(STAGE, name, Verdict.FAIL if failed else Verdict.PASS, worst_kl, kl_tolerance, where,
                       details)
