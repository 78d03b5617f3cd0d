"""A CPU reference of GLM-5 as a GGUF describes it, sparse attention (DSA) included.

The whole model (``glm-dsa`` GGUF: embedding, the main layers, final norm, output) in plain
PyTorch float32 from gguf-py's dequantization of the file's tensors, so that every
number can be followed. Each layer's attention is DeepSeek Sparse Attention as GLM-5 was
trained with it:

1. lightning indexer: ``q_I = indexer.attn_q_b(qr)`` ([heads_I, dim_I] per token, qr the
   normalized query latent), ``k_I = LayerNorm(indexer.attn_k(x))`` (one key per token,
   weight and bias), RoPE on the first ``rope.dimension_count`` dims of both (layout
   ``[rope | nope]``, rotation of adjacent pairs), head weights
   ``w = indexer.proj(x) / sqrt(dim_I * heads_I)``, and the score of key s for query t
   ``sum_h w[t, h] * relu(q_I[t, h] . k_I[s])``;
2. top-k: the ``indexer.top_k`` keys of highest score among s <= t (all of them while
   t + 1 <= top_k);
3. MLA (absorbed form, the latent ``c = RMSNorm(kv_a)`` and the roped ``k_pe``) whose
   softmax runs over the selected keys only.

``attention="sparse-fp8"`` rounds the indexer's q and k to float8 e4m3 with one
power-of-two scale per 128 values before the scores, as vLLM's indexer does
(``per_token_group_quant_fp8`` with ue8m0 scales for q, ``indexer_k_quant_and_cache``
for its key cache): the selection a correct vLLM sparse path makes, where it differs
from float32 scores at near-ties.

``attention="dense"`` skips 1-2 (every s <= t attends): the computation vLLM's dense
Triton MLA path (patch 0004) does, which equals the sparse one only while a sequence
has at most top_k tokens. That is what the tests of this module show against llama.cpp's
``glm-dsa`` (``src/models/glm-dsa.cpp``, an implementation by other people) on the tiny
fixture: sparse agrees, dense does not, once the prompt is longer than top_k.

Fault injection for the diagnostics funnel: ``selection_fault="shift"`` moves every
selected key one position back (an off-by-one selection), ``"causal"`` lets the indexer
see one future token, ``"rope_halves"`` ropes the indexer with rotate-half pairs (the
layout fault between llama.cpp's and some Hugging Face conventions).

The NextN (MTP) layer that speculative decoding drafts with: ``nextn`` / ``draft_chain``.

Not modelled: YaRN (GLM-5 has no rope scaling),
quantized activations (llama.cpp quantizes activations to 8 bits for K-quant matmuls and
keeps f16 caches: the reason agreement is measured with top-1 and KL, not bitwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from glm5_tools.diagnostics.gguf_io import GGUFTensor, dequantize_full, read_tensors

Attention = Literal["sparse", "sparse-fp8", "dense"]
FP8_E4M3_MAX = 448.0
SelectionFault = Literal["none", "shift", "causal", "rope_halves"]
ARCH = "glm-dsa"
INDEXER_NORM_EPS = 1e-6  # DeepSeek V3.2 / GLM-5 indexer LayerNorm


@dataclass(frozen=True)
class GlmDsaHParams:
    n_layer: int  # main layers (block_count less the MTP layers)
    n_nextn: int  # NextN (MTP) layers after them
    n_dense: int  # leading dense layers
    n_embd: int
    n_head: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int
    rope_base: float
    rms_eps: float
    n_expert: int
    n_expert_used: int
    expert_weights_scale: float
    expert_weights_norm: bool
    index_heads: int
    index_dim: int
    index_topk: int

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> GlmDsaHParams:
        if meta.get("general.architecture") != ARCH:
            raise ValueError(f"not a {ARCH} GGUF: general.architecture={meta.get('general.architecture')!r}")

        def g(key: str) -> Any:
            full = f"{ARCH}.{key}"
            if full not in meta:
                raise ValueError(f"GGUF lacks {full}")
            return meta[full]

        k_mla = int(g("attention.key_length_mla"))
        rope = int(g("rope.dimension_count"))
        return cls(
            n_layer=int(g("block_count")) - int(meta.get(f"{ARCH}.nextn_predict_layers", 0)),
            n_nextn=int(meta.get(f"{ARCH}.nextn_predict_layers", 0)),
            n_dense=int(g("leading_dense_block_count")),
            n_embd=int(g("embedding_length")),
            n_head=int(g("attention.head_count")),
            q_lora=int(g("attention.q_lora_rank")),
            kv_lora=int(g("attention.kv_lora_rank")),
            qk_nope=k_mla - rope,
            qk_rope=rope,
            v_head=int(g("attention.value_length_mla")),
            rope_base=float(g("rope.freq_base")),
            rms_eps=float(g("attention.layer_norm_rms_epsilon")),
            n_expert=int(g("expert_count")),
            n_expert_used=int(g("expert_used_count")),
            expert_weights_scale=float(meta.get(f"{ARCH}.expert_weights_scale", 1.0)),
            expert_weights_norm=bool(meta.get(f"{ARCH}.expert_weights_norm", False)),
            index_heads=int(g("attention.indexer.head_count")),
            index_dim=int(g("attention.indexer.key_length")),
            index_topk=int(g("attention.indexer.top_k")),
        )


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rope_pairs(x: torch.Tensor, pos: torch.Tensor, base: float, *, halves: bool = False) -> torch.Tensor:
    """RoPE over the last dim of x [T, ..., d] at positions pos [T].

    Default: rotation of adjacent pairs (x[2i], x[2i+1]), llama.cpp's ROPE_TYPE_NORM, which
    GLM-5's ``rope_interleave`` checkpoints and the glm-dsa GGUF use. ``halves``: pairs
    (x[i], x[i + d/2]) instead (NeoX style), only for fault injection.
    """
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).to(x.dtype)  # [T, d/2]
    shape = [ang.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = ang.cos().reshape(shape), ang.sin().reshape(shape)
    if halves:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def causal_mask(t: int) -> torch.Tensor:
    """[T, T], True where key s may be seen by query t (s <= t)."""
    i = torch.arange(t)
    return i[None, :] <= i[:, None]


def indexer_scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """[T, S] scores: sum_h w[t,h] relu(q[t,h].k[s]); -inf where not visible.

    q [T, H, D], k [S, D], w [T, H] (already scaled), visible [T, S] bool.
    """
    logits = torch.relu(torch.einsum("thd,sd->ths", q, k))
    scores = torch.einsum("ths,th->ts", logits, w)
    return scores.masked_fill(~visible, float("-inf"))


def fp8_ue8m0(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x rounded to float8 e4m3 with a power-of-two scale per last-dim row (as vLLM's
    indexer quantizes its q and k), returned in float32."""
    amax = x.abs().amax(-1, keepdim=True).clamp(min=eps)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_E4M3_MAX)))
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def select_topk(scores: torch.Tensor, topk: int, visible: torch.Tensor) -> torch.Tensor:
    """[T, S] bool: the top-k visible keys of each query (every visible one when fewer)."""
    k = min(topk, scores.shape[-1])
    idx = scores.topk(k, dim=-1).indices
    chosen = torch.zeros_like(visible)
    chosen.scatter_(1, idx, True)
    return chosen & visible


def shift_selection(chosen: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Fault injection: every selected key moved one position back (clamped at 0)."""
    rolled = torch.zeros_like(chosen)
    rolled[:, :-1] = chosen[:, 1:]
    rolled[:, 0] |= chosen[:, 0]
    return rolled & visible


@dataclass
class LayerTrace:
    """What one layer's attention selected (for the diagnostics stage)."""

    chosen: torch.Tensor  # [T, T] bool
    scores: torch.Tensor | None  # [T, T] indexer scores (None for dense)


@dataclass
class Forward:
    logits: torch.Tensor  # [T, V] float32
    layers: list[LayerTrace] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # [T, n_embd]: after the final norm


@dataclass
class NextnForward:
    logits: torch.Tensor  # [T, V] float32
    out: torch.Tensor  # [T, n_embd]: after the shared head's norm (the next step's input)


class GlmDsaReference:
    """The model of one glm-dsa GGUF (one file or the first shard of a split), on the CPU."""

    def __init__(self, path: Path | str, *, index_topk: int | None = None) -> None:
        self._tensors, meta = read_tensors(Path(path))
        hp = GlmDsaHParams.from_meta(meta)
        if index_topk is not None:
            hp = GlmDsaHParams(**{**hp.__dict__, "index_topk": int(index_topk)})
        self.hp = hp
        self._cache: dict[str, torch.Tensor] = {}
        # What a serving stack's MLA cache keeps of each token's latent c and roped k_pe
        # (e.g. bf16 or vLLM's fp8_ds_mla rounding, latent_cache_rounding); None = float32.
        self.latent_cache: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None

    def w(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            t: GGUFTensor | None = self._tensors.get(name)
            if t is None:
                raise KeyError(f"GGUF has no tensor {name}")
            self._cache[name] = torch.from_numpy(dequantize_full(t).copy()).float()
        return self._cache[name]

    def has(self, name: str) -> bool:
        return name in self._tensors

    @property
    def n_vocab(self) -> int:
        """Rows of the token embedding (the GGUF's vocabulary, padding included)."""
        return int(self._tensors["token_embd.weight"].shape[0])

    # --- blocks -------------------------------------------------------------------------

    def _ffn(self, x: torch.Tensor, prefix: str, suffix: str = "") -> torch.Tensor:
        gate = x @ self.w(f"{prefix}.ffn_gate{suffix}.weight").T
        up = x @ self.w(f"{prefix}.ffn_up{suffix}.weight").T
        return (torch.nn.functional.silu(gate) * up) @ self.w(f"{prefix}.ffn_down{suffix}.weight").T

    def _moe(self, x: torch.Tensor, il: int, tap: dict[str, torch.Tensor] | None = None,
             router_logits: torch.Tensor | None = None) -> torch.Tensor:
        """``router_logits``: route by these [T, E] (another implementation's, to check its
        choice and weights on its own logits) instead of x's."""
        hp, p = self.hp, f"blk.{il}"
        if router_logits is None:
            router_logits = x @ self.w(f"{p}.ffn_gate_inp.weight").T
        router_logits = router_logits.float()
        probs = torch.sigmoid(router_logits)  # [T, E]
        choose = probs + self.w(f"{p}.exp_probs_b.bias") if self.has(f"{p}.exp_probs_b.bias") else probs
        sel = choose.topk(hp.n_expert_used, dim=-1).indices  # [T, k]
        wts = probs.gather(1, sel)
        if hp.expert_weights_norm:
            wts = wts / wts.sum(-1, keepdim=True)
        if tap is not None:
            tap.update(router_logits=router_logits, topk_ids=sel, topk_weights=wts.clone(), choice_scores=choose)
        wts = wts * hp.expert_weights_scale
        gate, up, down = (self.w(f"{p}.ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        out = torch.zeros_like(x)
        for j in range(hp.n_expert_used):
            for e in sel[:, j].unique().tolist():
                rows = (sel[:, j] == e).nonzero().squeeze(1)
                xe = x[rows]
                h = torch.nn.functional.silu(xe @ gate[e].T) * (xe @ up[e].T)
                out[rows] += wts[rows, j, None] * (h @ down[e].T)
        shared = self._ffn(x, p, "_shexp")
        if tap is not None:
            tap.update(routed=out, shared=shared)
        return out + shared

    def _attention(
        self, x: torch.Tensor, il: int, attention: Attention, fault: SelectionFault
    ) -> tuple[torch.Tensor, LayerTrace]:
        hp, p = self.hp, f"blk.{il}"
        t = x.shape[0]
        pos = torch.arange(t)
        visible = causal_mask(t)

        qr = rms_norm(x @ self.w(f"{p}.attn_q_a.weight").T, self.w(f"{p}.attn_q_a_norm.weight"), hp.rms_eps)

        scores: torch.Tensor | None = None
        if attention == "dense":
            chosen = visible
        else:
            qi = (qr @ self.w(f"{p}.indexer.attn_q_b.weight").T).reshape(t, hp.index_heads, hp.index_dim)
            ki = layer_norm(
                x @ self.w(f"{p}.indexer.attn_k.weight").T,
                self.w(f"{p}.indexer.k_norm.weight"),
                self.w(f"{p}.indexer.k_norm.bias"),
                INDEXER_NORM_EPS,
            )
            r, halves = hp.qk_rope, fault == "rope_halves"
            qi = torch.cat([rope_pairs(qi[..., :r], pos, hp.rope_base, halves=halves), qi[..., r:]], dim=-1)
            ki = torch.cat([rope_pairs(ki[:, :r], pos, hp.rope_base, halves=halves), ki[:, r:]], dim=-1)
            wi = (x @ self.w(f"{p}.indexer.proj.weight").T) / math.sqrt(hp.index_dim * hp.index_heads)
            if attention == "sparse-fp8":
                # vLLM: q per (token, head) group of 128 (eps 1e-10), k per token (eps 1e-4)
                qi, ki = fp8_ue8m0(qi, 1e-10), fp8_ue8m0(ki, 1e-4)
            seen = visible
            if fault == "causal":
                seen = torch.ones_like(visible).tril(1)
            scores = indexer_scores(qi, ki, wi, seen)
            chosen = select_topk(scores, hp.index_topk, seen) & visible
            if fault == "shift":
                chosen = shift_selection(chosen, visible)

        q = (qr @ self.w(f"{p}.attn_q_b.weight").T).reshape(t, hp.n_head, hp.qk_nope + hp.qk_rope)
        q_nope, q_pe = q[..., : hp.qk_nope], rope_pairs(q[..., hp.qk_nope :], pos, hp.rope_base)
        kv = x @ self.w(f"{p}.attn_kv_a_mqa.weight").T
        c = rms_norm(kv[:, : hp.kv_lora], self.w(f"{p}.attn_kv_a_norm.weight"), hp.rms_eps)
        k_pe = rope_pairs(kv[:, hp.kv_lora :], pos, hp.rope_base)
        if self.latent_cache is not None:
            c, k_pe = self.latent_cache(c, k_pe)

        k_b = self.w(f"{p}.attn_k_b.weight")  # [H, kv_lora, nope]
        v_b = self.w(f"{p}.attn_v_b.weight")  # [H, v_head, kv_lora]
        q_lat = torch.einsum("thd,hcd->thc", q_nope, k_b)
        s = torch.einsum("thc,sc->hts", q_lat, c) + torch.einsum("thr,sr->hts", q_pe, k_pe)
        s = (s / math.sqrt(hp.qk_nope + hp.qk_rope)).masked_fill(~chosen[None], float("-inf"))
        lat = torch.einsum("hts,sc->thc", torch.softmax(s, dim=-1), c)
        o = torch.einsum("thc,hvc->thv", lat, v_b).reshape(t, hp.n_head * hp.v_head)
        return o @ self.w(f"{p}.attn_output.weight").T, LayerTrace(chosen=chosen, scores=scores)

    # --- the model ----------------------------------------------------------------------

    def forward(
        self,
        tokens: list[int],
        *,
        attention: Attention = "sparse",
        selection_fault: SelectionFault = "none",
        keep_trace: bool = False,
        taps: list[dict[str, torch.Tensor]] | None = None,
    ) -> Forward:
        """``taps``: if given, filled with one dict per layer of its sub-blocks' values
        (attn_norm, attn, ffn_norm, mlp, out; MoE layers also router_logits, topk_ids,
        topk_weights (normalized, before expert_weights_scale), choice_scores, routed
        (scaled), shared), as vllm_forward's taps name them."""
        if not tokens:
            raise ValueError("empty prompt")
        with torch.no_grad():
            return self._forward(tokens, attention, selection_fault, keep_trace, taps)

    def _forward(
        self, tokens: list[int], attention: Attention, selection_fault: SelectionFault, keep_trace: bool,
        taps: list[dict[str, torch.Tensor]] | None = None,
    ) -> Forward:
        hp = self.hp
        x = self.w("token_embd.weight")[torch.tensor(tokens, dtype=torch.long)]
        traces: list[LayerTrace] = []
        for il in range(hp.n_layer):
            tap: dict[str, torch.Tensor] | None = {} if taps is not None else None
            x, trace = self._block(x, il, attention, selection_fault, tap)
            if keep_trace:
                traces.append(trace)
            if tap is not None and taps is not None:
                taps.append(tap)
        x = rms_norm(x, self.w("output_norm.weight"), hp.rms_eps)
        return Forward(logits=x @ self._head().T, layers=traces, hidden=x)

    def _head(self) -> torch.Tensor:
        return self.w("output.weight") if self.has("output.weight") else self.w("token_embd.weight")

    def _block(self, x: torch.Tensor, il: int, attention: Attention, fault: SelectionFault,
               tap: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, LayerTrace]:
        """One decoder layer (pre-norm attention and FFN/MoE, residuals) of the residual stream x."""
        hp = self.hp
        normed = rms_norm(x, self.w(f"blk.{il}.attn_norm.weight"), hp.rms_eps)
        a, trace = self._attention(normed, il, attention, fault)
        x = x + a
        h = rms_norm(x, self.w(f"blk.{il}.ffn_norm.weight"), hp.rms_eps)
        m = self._ffn(h, f"blk.{il}") if il < hp.n_dense else self._moe(h, il, tap)
        x = x + m
        if tap is not None:
            tap.update(attn_norm=normed, attn=a, ffn_norm=h, mlp=m, out=x)
        return x, trace

    # --- the NextN (MTP) layer ----------------------------------------------------------

    def nextn(self, tokens: list[int], hidden: torch.Tensor, *, layer: int = 0,
              attention: Attention = "sparse-fp8", mask_first: bool = True) -> NextnForward:
        """GLM-5's NextN layer ``blk.{n_layer + layer}`` over a sequence: at position i the
        token ``tokens[i]`` (the one after the main model's position i) and the hidden
        state ``hidden[i]`` (the main model's final-norm output there, or the previous
        draft step's output), positions 0..T-1:

        ``x = eh_proj([enorm(embed(token)) ; hnorm(hidden)])``, one decoder layer (its
        own DSA attention over the sequence, MoE), ``out = shared_head_norm(x)``,
        ``logits = out @ output^T``. ``out`` is also what the next draft step takes in
        as its hidden state (GLM NextN; llama.cpp's glm-dsa MTP graph does the same).
        The embedding and head are the model's (the GGUF's ``nextn.embed_tokens`` /
        ``nextn.shared_head_head`` when it has them). ``mask_first``: the embedding at
        position 0 is zeroed, as vLLM's DeepSeek MTP layer does (llama.cpp does not).
        """
        with torch.no_grad():
            return self._nextn(tokens, hidden, layer, attention, mask_first)

    def _nextn(self, tokens: list[int], hidden: torch.Tensor, layer: int, attention: Attention,
               mask_first: bool) -> NextnForward:
        hp = self.hp
        if not 0 <= layer < hp.n_nextn:
            raise ValueError(f"NextN layer {layer}: the GGUF has {hp.n_nextn}")
        if hidden.shape != (len(tokens), hp.n_embd):
            raise ValueError(f"hidden {tuple(hidden.shape)} for {len(tokens)} tokens of {hp.n_embd}")
        il = hp.n_layer + layer
        p = f"blk.{il}.nextn"
        embd = self.w(f"{p}.embed_tokens.weight") if self.has(f"{p}.embed_tokens.weight") \
            else self.w("token_embd.weight")
        e = embd[torch.tensor(tokens, dtype=torch.long)]
        if mask_first:
            e[0] = 0.0
        e = rms_norm(e, self.w(f"{p}.enorm.weight"), hp.rms_eps)
        h = rms_norm(hidden.float(), self.w(f"{p}.hnorm.weight"), hp.rms_eps)
        x = torch.cat([e, h], dim=-1) @ self.w(f"{p}.eh_proj.weight").T
        x, _ = self._block(x, il, attention, "none", None)
        out = rms_norm(x, self.w(f"{p}.shared_head_norm.weight"), hp.rms_eps)
        head = self.w(f"{p}.shared_head_head.weight") if self.has(f"{p}.shared_head_head.weight") \
            else self._head()
        return NextnForward(logits=out @ head.T, out=out)

    def draft_chain(self, tokens: list[int], hidden: torch.Tensor, next_inputs: list[int], *,
                    attention: Attention = "sparse-fp8", mask_first: bool = True) -> list[NextnForward]:
        """A chain of 1 + len(next_inputs) draft steps as a speculative decoder runs it:
        step 0 is ``nextn(tokens, hidden)``; step k > 0 appends ``next_inputs[k-1]`` to the
        tokens and step k-1's output at its last position to the hidden states. Returns
        each step's NextnForward (its last position is the step's draft)."""
        toks, hid = list(tokens), hidden.float()
        steps = [self.nextn(toks, hid, attention=attention, mask_first=mask_first)]
        for tok in next_inputs:
            toks.append(int(tok))
            hid = torch.cat([hid, steps[-1].out[-1:]], dim=0)
            steps.append(self.nextn(toks, hid, attention=attention, mask_first=mask_first))
        return steps


def latent_cache_rounding(kind: str) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """GlmDsaReference.latent_cache for a cache kind: "bf16" (c and k_pe rounded to
    bf16, vLLM's default MLA cache) or "fp8_ds_mla" (vLLM's fp8 layout, patch 0013 for
    TRITON_MLA_SPARSE: c in bf16, then float8 e4m3 with one fp32 scale per 128 values =
    their largest magnitude / 448; k_pe in bf16)."""
    def bf16(c: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return c.to(torch.bfloat16).float(), k_pe.to(torch.bfloat16).float()

    def fp8_ds_mla(c: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = c.to(torch.bfloat16).float().reshape(c.shape[0], -1, 128)
        scale = (t.abs().amax(-1, keepdim=True) / 448.0).clamp(min=torch.finfo(torch.float32).tiny)
        q = (t / scale).to(torch.float8_e4m3fn).float() * scale
        return q.reshape(c.shape), k_pe.to(torch.bfloat16).float()

    kinds = {"bf16": bf16, "fp8_ds_mla": fp8_ds_mla}
    if kind not in kinds:
        raise ValueError(f"latent cache {kind!r}: expected one of {', '.join(kinds)}")
    return kinds[kind]


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), dim=-1)


@dataclass(frozen=True)
class Agreement:
    """How two models' next-token distributions agree over the same positions."""

    positions: int
    top1: float  # fraction of positions with the same argmax
    kl_mean: float  # mean KL(ref || got) in nats
    kl_max: float

    def as_dict(self) -> dict[str, float | int]:
        return {"positions": self.positions, "top1": self.top1, "kl_mean": self.kl_mean, "kl_max": self.kl_max}


def agreement(got: torch.Tensor, ref: torch.Tensor, *, start: int = 0) -> Agreement:
    """Top-1 agreement and KL(ref || got) over positions start.. of two [T, V] logit tensors."""
    g, r = log_softmax(got[start:].float()), log_softmax(ref[start:].float())
    kl = (r.exp() * (r - g)).sum(-1)
    top1 = (g.argmax(-1) == r.argmax(-1)).double().mean()
    return Agreement(positions=int(g.shape[0]), top1=float(top1), kl_mean=float(kl.mean()), kl_max=float(kl.max()))
