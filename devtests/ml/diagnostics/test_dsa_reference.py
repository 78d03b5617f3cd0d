"""The CPU reference of GLM-5's sparse attention against llama.cpp's glm-dsa (issue 13).

llama.cpp (built from the llama-cpp-python sdist) runs GLM-5's lightning indexer and
top-k selection on the CPU. On the tiny fixture's BF16 GGUF the reference must agree with
it: bit-close while the prompt is shorter than top_k (sparse = dense there), and within
the spread of two float implementations once top_k (16 or 32, set with llama.cpp's own
metadata override on the same file) is a quarter to a fifth of the prompt. The dense
computation, and the reference with an off-by-one selection, must then disagree, or the
comparison could not tell sparse from dense.

Measured (this file's prompts, BF16): sparse top-1 0.96-0.97, KL 0.0013-0.0135; dense
KL 0.20-0.36; shift KL 0.32-0.60; in the dense regime KL 2e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_tools.diagnostics.dsa_reference import (
    GlmDsaReference,
    agreement,
    causal_mask,
    indexer_scores,
    rope_pairs,
    select_topk,
    shift_selection,
)

FIXTURE = Path(__file__).resolve().parents[3] / ".cache" / "fixtures" / "tiny-glm5"
BF16 = FIXTURE / "gguf" / "tiny-glm5-BF16.gguf"
TOPK_KEY = "glm-dsa.attention.indexer.top_k"
# Sparse reference vs llama.cpp on the same BF16 weights: llama.cpp keeps f16 caches and
# rotates the indexer keys (Hadamard) before caching them, so near-tied keys at the top-k
# boundary can swap; the bound is twice the worst measured (0.0135).
SPARSE_KL_MAX = 0.03
SPARSE_TOP1_MIN = 0.9
# What a wrong selection costs on these prompts (measured 0.20 at the least).
WRONG_KL_MIN = 0.1


def _prompt(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1922, 1924, *rng.integers(0, 1900, n - 2).tolist()]


# --- the pieces, on numbers small enough to check by hand ----------------------------------


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [True, True, True, False], [True, True, True, True]]


def test_topk_takes_every_visible_key_while_fewer_than_k():
    t = 6
    vis = causal_mask(t)
    scores = indexer_scores(torch.randn(t, 2, 4), torch.randn(t, 4), torch.rand(t, 2), vis)
    chosen = select_topk(scores, 3, vis)
    assert chosen.sum(-1).tolist() == [1, 2, 3, 3, 3, 3]
    assert not (chosen & ~vis).any(), "a future key was selected"


def test_topk_picks_the_highest_scores():
    vis = causal_mask(5)
    scores = torch.tensor([[0.0, 0, 0, 0, 0], [1, 2, 0, 0, 0], [3, 1, 2, 0, 0],
                           [0, 5, 4, 9, 0], [7, 1, 8, 2, 6]]).masked_fill(~vis, float("-inf"))
    chosen = select_topk(scores, 2, vis)
    assert [sorted(torch.nonzero(r).squeeze(1).tolist()) for r in chosen] == [[0], [0, 1], [0, 2], [1, 3], [0, 2]]


def test_indexer_scores_are_relu_weighted_sums():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # one query, two heads
    k = torch.tensor([[2.0, -3.0]])
    w = torch.tensor([[0.5, 10.0]])
    s = indexer_scores(q, k, w, torch.ones(1, 1, dtype=torch.bool))
    assert s.item() == pytest.approx(0.5 * 2.0 + 10.0 * 0.0)  # relu(-3) = 0


def test_shift_moves_each_selection_one_back():
    vis = causal_mask(4)
    chosen = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    assert shift_selection(chosen, vis).int().tolist() == [[1, 0, 0, 0], [1, 0, 0, 0],
                                                           [0, 1, 0, 0], [1, 0, 1, 0]]


def test_rope_pairs_rotates_adjacent_pairs_and_keeps_norms():
    x = torch.randn(5, 3, 8)
    pos = torch.arange(5)
    y = rope_pairs(x, pos, 10000.0)
    assert torch.allclose(y[0], x[0])  # position 0: identity
    assert torch.allclose(y.reshape(5, 3, 4, 2).norm(dim=-1), x.reshape(5, 3, 4, 2).norm(dim=-1), atol=1e-5)
    assert not torch.allclose(rope_pairs(x, pos, 10000.0, halves=True), y)


# --- the whole model, against llama.cpp ------------------------------------------------------

needs_fixture = pytest.mark.skipif(not BF16.exists(), reason="tiny GLM-5 fixture not built (scripts/make-tiny-glm5)")


@pytest.fixture(scope="module")
def llama_logits():
    from glm5_tools.fixtures.reference import reference_logits

    def run(tokens: list[int], topk: int | None) -> torch.Tensor:
        over = {TOPK_KEY: topk} if topk else None
        return torch.from_numpy(reference_logits(BF16, tokens, n_threads=2, kv_overrides=over).logits)

    return run


@needs_fixture
def test_dense_regime_equals_llama_cpp(llama_logits):
    """Prompt shorter than the file's top_k (2048): sparse = dense = llama.cpp."""
    toks = _prompt(96, 0)
    model = GlmDsaReference(BF16)
    sparse = model.forward(toks).logits
    dense = model.forward(toks, attention="dense").logits
    assert torch.equal(sparse, dense)
    a = agreement(sparse, llama_logits(toks, None))
    assert a.top1 >= 0.95 and a.kl_mean < 1e-3, a


@needs_fixture
@pytest.mark.parametrize(("topk", "length", "seed"), [(16, 128, 1), (32, 160, 2)])
def test_sparse_agrees_with_llama_cpp_and_dense_does_not(llama_logits, topk, length, seed):
    toks = _prompt(length, seed)
    ref = llama_logits(toks, topk)
    model = GlmDsaReference(BF16, index_topk=topk)
    start = topk  # before it every key is selected: sparse = dense there
    sparse = agreement(model.forward(toks).logits, ref, start=start)
    dense = agreement(model.forward(toks, attention="dense").logits, ref, start=start)
    shifted = agreement(model.forward(toks, selection_fault="shift").logits, ref, start=start)
    assert sparse.top1 >= SPARSE_TOP1_MIN and sparse.kl_mean <= SPARSE_KL_MAX, sparse
    assert dense.kl_mean >= WRONG_KL_MIN and dense.kl_mean > 10 * sparse.kl_mean, dense
    assert shifted.kl_mean >= WRONG_KL_MIN and shifted.kl_mean > 10 * sparse.kl_mean, shifted


@needs_fixture
def test_trace_selects_topk_per_query():
    toks = _prompt(48, 3)
    fwd = GlmDsaReference(BF16, index_topk=16).forward(toks, keep_trace=True)
    assert len(fwd.layers) == GlmDsaReference(BF16).hp.n_layer
    for tr in fwd.layers:
        counts = tr.chosen.sum(-1)
        assert counts.tolist() == [min(i + 1, 16) for i in range(48)]
        assert not (tr.chosen & ~causal_mask(48)).any()
