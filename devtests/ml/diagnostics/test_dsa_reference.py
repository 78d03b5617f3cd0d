"""The CPU reference of GLM-5's sparse attention against llama.cpp's glm-dsa.

llama.cpp (built from the llama-cpp-python sdist) runs GLM-5's lightning indexer and
top-k selection on the CPU. Two fixtures, both made by llama.cpp's own converter and
quantizer (docs/fixtures.md): the main one (index_topk 2048, as GLM-5) and the
small-top-k variant ``tiny-glm5-topk32`` (index_topk 32 in config.json and so in the
GGUF's ``glm-dsa.attention.indexer.top_k``). On the main BF16 GGUF, with prompts shorter
than top_k, sparse = dense and the reference is bit-close to llama.cpp. On the variant,
with prompts of 4x and 8x top_k, the reference must agree with llama.cpp within the
spread of two float implementations, and the dense computation and the reference with an
off-by-one selection must disagree, or the comparison could not tell sparse from dense.

Measured: see docs/diagnostics.md ("Sparse attention reference").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_tools.diagnostics import stage_sparse
from glm5_tools.diagnostics.dsa_reference import (
    GlmDsaReference,
    agreement,
    causal_mask,
    fp8_ue8m0,
    indexer_scores,
    latent_cache_rounding,
    rope_pairs,
    select_topk,
    shift_selection,
)
from glm5_tools.diagnostics.result import Verdict

FIXTURES = Path(__file__).resolve().parents[3] / ".cache" / "fixtures"
BF16 = FIXTURES / "tiny-glm5" / "gguf" / "tiny-glm5-BF16.gguf"
SMALL_TOPK = 32
SMALL = FIXTURES / f"tiny-glm5-topk{SMALL_TOPK}"
SMALL_BF16 = SMALL / "gguf" / "tiny-glm5-BF16.gguf"
SMALL_Q4 = SMALL / "gguf" / "tiny-glm5-UD-Q4_K_XL.gguf"
TOPK_KEY = "glm-dsa.attention.indexer.top_k"
# Sparse reference vs llama.cpp on the same BF16 weights: llama.cpp keeps f16 caches and
# rotates the indexer keys (Hadamard) before caching them, so near-tied keys at the top-k
# boundary can swap; the bound is about twice the worst measured (docs/diagnostics.md).
SPARSE_KL_MAX = 0.03
SPARSE_TOP1_MIN = 0.9
# What a wrong selection costs on these prompts (measured >= 0.2; docs/diagnostics.md).
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



def test_latent_cache_rounding_as_the_caches_keep_it():
    """bf16 and vLLM's fp8_ds_mla (patch 0013): one fp32 scale per 128 latent values (their
    largest magnitude / 448), e4m3 values; the rope part bf16 in both."""
    gen = torch.Generator().manual_seed(0)
    c, k_pe = torch.randn(3, 512, generator=gen) * 3, torch.randn(3, 64, generator=gen)
    c[1, 200] = 100.0  # one outlier: only its own tile's scale grows
    c16, pe16 = latent_cache_rounding("bf16")(c, k_pe)
    assert torch.equal(c16, c.to(torch.bfloat16).float()) and torch.equal(pe16, k_pe.to(torch.bfloat16).float())
    c8, pe8 = latent_cache_rounding("fp8_ds_mla")(c, k_pe)
    assert torch.equal(pe8, pe16)
    tile_max = c16.reshape(3, 4, 128).abs().amax(-1, keepdim=True)
    err = (c8 - c16).reshape(3, 4, 128).abs()
    assert bool((err <= tile_max * 16 / 448 * 1.0001).all())  # half an e4m3 ulp of the top binade
    assert bool((c8.reshape(3, 4, 128).abs().amax(-1, keepdim=True) == tile_max).all())  # the max is exact
    # each tile has its own scale: the outlier changes its tile's values only
    plain = c.clone()
    plain[1, 200] = c[1, 201]
    c8_plain, _ = latent_cache_rounding("fp8_ds_mla")(plain, k_pe)
    changed = (c8_plain != c8).reshape(3, 4, 128).any(-1)
    assert changed.tolist() == [[False] * 4, [False, True, False, False], [False] * 4]
    with pytest.raises(ValueError, match="latent cache 'fp8_e5m2'"):
        latent_cache_rounding("fp8_e5m2")

def test_rope_pairs_rotates_adjacent_pairs_and_keeps_norms():
    x = torch.randn(5, 3, 8)
    pos = torch.arange(5)
    y = rope_pairs(x, pos, 10000.0)
    assert torch.allclose(y[0], x[0])  # position 0: identity
    assert torch.allclose(y.reshape(5, 3, 4, 2).norm(dim=-1), x.reshape(5, 3, 4, 2).norm(dim=-1), atol=1e-5)
    assert not torch.allclose(rope_pairs(x, pos, 10000.0, halves=True), y)


# --- the whole model, against llama.cpp ------------------------------------------------------

needs_fixture = pytest.mark.skipif(not BF16.exists(), reason="tiny GLM-5 fixture not built (scripts/make-tiny-glm5)")
needs_small = pytest.mark.skipif(
    not SMALL_BF16.exists(),
    reason=f"small-top-k fixture not built (scripts/make-tiny-glm5 --index-topk {SMALL_TOPK})")


def _llama(path: Path, tokens: list[int]) -> torch.Tensor:
    from glm5_tools.fixtures.reference import reference_logits

    return torch.from_numpy(reference_logits(path, tokens, n_threads=2).logits)


@needs_fixture
def test_dense_regime_equals_llama_cpp():
    """Prompt shorter than the file's top_k (2048): sparse = dense = llama.cpp."""
    toks = _prompt(96, 0)
    model = GlmDsaReference(BF16)
    sparse = model.forward(toks).logits
    dense = model.forward(toks, attention="dense").logits
    assert torch.equal(sparse, dense)
    a = agreement(sparse, _llama(BF16, toks))
    assert a.top1 >= 0.95 and a.kl_mean < 1e-3, a


@needs_small
def test_small_topk_fixture_is_llama_cpps_own():
    """The variant is made like the main fixture: llama.cpp's converter wrote the config's
    index_topk into the GGUF, and both files keep the indexer tensors of every layer."""
    from glm5_tools.fixtures import make
    from glm5_tools.fixtures import manifest as manifest_mod

    data = manifest_mod.read_manifest(SMALL)
    assert data is not None and data["fixture"] == f"tiny-glm5-topk{SMALL_TOPK}"
    assert data["config"]["index_topk"] == SMALL_TOPK
    assert manifest_mod.manifest_matches(SMALL, make.recipe_digest(SMALL_TOPK))
    for path in (SMALL_BF16, SMALL_Q4):
        model = GlmDsaReference(path)
        assert model.hp.index_topk == SMALL_TOPK, path
        for il in range(model.hp.n_layer):
            for name in ("attn_k", "attn_q_b", "proj", "k_norm"):
                assert model.has(f"blk.{il}.indexer.{name}.weight"), (path, il, name)


@needs_small
def test_stage_7_agrees_with_llama_cpp_where_dense_does_not():
    """Stage 7 on the small-top-k BF16 GGUF, prompts of 4x and 8x top_k: the reference's
    sparse attention agrees with llama.cpp; the stage itself also requires the dense
    computation and an off-by-one selection to be 10x further off (it fails otherwise)."""
    r = stage_sparse.run_stage(SMALL_BF16, multiples=(4, 8), seed=1)
    print("\n".join(r.details))
    assert r.verdict is Verdict.PASS, r.details
    assert r.measured is not None and r.measured <= SPARSE_KL_MAX
    assert len(r.details) == 3 and all("dense" in d and "off-by-one" in d for d in r.details[1:])


@needs_small
@pytest.mark.parametrize("fault", ["shift", "rope_halves"])
def test_stage_7_catches_a_selection_fault(fault, tmp_path: Path):
    """The funnel's command line with an injected selection fault exits 1 on stage 7."""
    from glm5_tools.diagnostics import cli

    report = tmp_path / "r.json"
    rc = cli.main(["--gguf", str(SMALL_BF16), "--hf-config", str(SMALL / "hf"), "--tp", "1",
                   "--device", "cpu", "--stages", "7", "--selection-fault", fault, "--json", str(report)])
    import json

    (stage,) = json.loads(report.read_text())["stages"]
    assert rc == 1 and stage["verdict"] == "fail" and stage["measured"] > WRONG_KL_MIN, stage


def test_stage_7_fails_when_the_prompts_cannot_tell_sparse_from_dense(monkeypatch):
    """A model whose selection changes nothing (here: forward ignores it) passes the
    agreement bound trivially; the stage fails it as not discriminating."""
    if not SMALL_BF16.exists():
        pytest.skip("small-top-k fixture not built")
    same = torch.randn(4 * SMALL_TOPK, 64)
    monkeypatch.setattr(GlmDsaReference, "forward",
                        lambda self, toks, **kw: type("F", (), {"logits": same})())
    r = stage_sparse.run_stage(SMALL_BF16, multiples=(4,), llama=lambda path, toks: same)
    assert r.measured == pytest.approx(0.0, abs=1e-9)
    assert r.verdict is Verdict.FAIL and any("cannot tell" in d for d in r.details), r.details


def test_stage_7_skips_a_gguf_too_large_for_the_cpu_reference(monkeypatch):
    if not BF16.exists():
        pytest.skip("tiny GLM-5 fixture not built")
    monkeypatch.setattr(stage_sparse, "MAX_GGUF_BYTES", 1024)
    r = stage_sparse.run_stage(BF16)
    assert r.verdict is Verdict.SKIP and "float32" in r.details[0]


@needs_fixture
def test_llama_cpp_top_k_override_reaches_the_indexer():
    """reference_logits' kv_overrides: llama.cpp with the main file's top_k overridden to
    32 computes what it computes on the variant whose file says 32 (same weights)."""
    from glm5_tools.fixtures.reference import reference_logits

    toks = _prompt(4 * SMALL_TOPK, 3)
    over = torch.from_numpy(reference_logits(BF16, toks, n_threads=2,
                                             kv_overrides={TOPK_KEY: SMALL_TOPK}).logits)
    plain = _llama(BF16, toks)
    assert agreement(over, plain, start=SMALL_TOPK).kl_mean > WRONG_KL_MIN
    if SMALL_BF16.exists():
        assert agreement(over, _llama(SMALL_BF16, toks)).kl_mean < 1e-4


@needs_small
def test_trace_selects_topk_per_query():
    toks = _prompt(48, 3)
    fwd = GlmDsaReference(SMALL_BF16).forward(toks, keep_trace=True)
    assert len(fwd.layers) == GlmDsaReference(SMALL_BF16).hp.n_layer
    for tr in fwd.layers:
        counts = tr.chosen.sum(-1)
        assert counts.tolist() == [min(i + 1, SMALL_TOPK) for i in range(48)]
        assert not (tr.chosen & ~causal_mask(48)).any()


def test_fp8_ue8m0_rounds_to_e4m3_with_power_of_two_scales():
    x = torch.tensor([[448.0 * 3, -1.0, 0.3, 0.0], [1e-3, -2e-3, 0.0, 5e-4], [0.0, 0.0, 0.0, 0.0]])
    q = fp8_ue8m0(x, 1e-4)
    amax = x.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    assert torch.equal(scale, torch.exp2(torch.round(torch.log2(scale))))  # powers of two
    assert torch.equal(q, (x / scale).to(torch.float8_e4m3fn).float() * scale)
    normal = x.abs() >= scale * 2**-6  # e4m3 normal range: relative error <= 2^-4
    assert ((q - x).abs() <= x.abs() * 2**-4 + 1e-12)[normal].all()
    assert torch.equal(q[2], x[2])


def test_fp8_indexer_changes_nothing_while_every_key_is_selected():
    toks = _prompt(SMALL_TOPK - 4, 5)
    model = GlmDsaReference(SMALL_BF16)
    assert torch.equal(model.forward(toks).logits, model.forward(toks, attention="sparse-fp8").logits)


def test_fp8_indexer_flips_only_near_ties_past_top_k():
    """Past top_k the fp8 scores select a few other keys: much closer to the float32
    selection than dense attention is (the residual a correct vLLM path shows)."""
    toks = _prompt(4 * SMALL_TOPK, 6)
    model = GlmDsaReference(SMALL_BF16)
    ref = model.forward(toks).logits
    fp8 = agreement(model.forward(toks, attention="sparse-fp8").logits, ref, start=SMALL_TOPK)
    dense = agreement(model.forward(toks, attention="dense").logits, ref, start=SMALL_TOPK)
    assert 0 < fp8.kl_mean < dense.kl_mean / 3
