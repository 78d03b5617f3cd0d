"""Plain PyTorch MLA, in the two forms the literature writes it, for stage 5.

expanded: K and V are rebuilt per head from the latent (k_nope = W_UK c, v = W_UV c),
then ordinary causal softmax attention. absorbed: W_UK is folded into the query and the
softmax runs over the latent (what vLLM's decode kernel does), then W_UV up-projects.
All in float32 on whatever device the inputs are on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MLAInputs:
    """One request at per-rank dims: its whole sequence and the queries of its last tokens."""

    kv_c: torch.Tensor  # [L, lora] normalized latent, context + new tokens
    k_pe: torch.Tensor  # [L, rope] roped key part (shared by all heads)
    q_nope: torch.Tensor  # [T, H, nope] queries of the last T tokens
    q_pe: torch.Tensor  # [T, H, rope]

    @property
    def seq_len(self) -> int:
        return int(self.kv_c.shape[0])

    @property
    def num_queries(self) -> int:
        return int(self.q_nope.shape[0])


def _mask(t: int, seq: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(seq - t, seq, device=device)[:, None]
    return torch.arange(seq, device=device)[None, :] > pos  # [T, L] True = hidden


def expanded(x: MLAInputs, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """[T, H, v]. w_uk [H, nope, lora], w_uv [H, v, lora]."""
    c, pe = x.kv_c.float(), x.k_pe.float()
    k_nope = torch.einsum("lc,hdc->hld", c, w_uk.float())
    v = torch.einsum("lc,hdc->hld", c, w_uv.float())
    s = torch.einsum("thd,hld->htl", x.q_nope.float(), k_nope)
    s = s + torch.einsum("thr,lr->htl", x.q_pe.float(), pe)
    s = (s * scale).masked_fill(_mask(x.num_queries, x.seq_len, c.device)[None], float("-inf"))
    return torch.einsum("htl,hld->thd", torch.softmax(s, dim=-1), v)


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """[T, H, nope] -> [T, H, lora]: the query in latent space."""
    return torch.einsum("thd,hdc->thc", q_nope.float(), w_uk.float())


def absorbed_latent(x: MLAInputs, w_uk: torch.Tensor, scale: float) -> torch.Tensor:
    """[T, H, lora]: the attention output before W_UV."""
    c, pe = x.kv_c.float(), x.k_pe.float()
    ql = absorb_query(x.q_nope, w_uk)
    s = torch.einsum("thc,lc->htl", ql, c) + torch.einsum("thr,lr->htl", x.q_pe.float(), pe)
    s = (s * scale).masked_fill(_mask(x.num_queries, x.seq_len, c.device)[None], float("-inf"))
    return torch.einsum("htl,lc->thc", torch.softmax(s, dim=-1), c)


def absorbed(x: MLAInputs, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.einsum("thc,hvc->thv", absorbed_latent(x, w_uk, scale), w_uv.float())


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (NaN when got is not finite)."""
    got, ref = got.float().to(ref.device), ref.float()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
