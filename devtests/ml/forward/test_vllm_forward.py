"""The whole model as vLLM runs it, on the CPU, against llama.cpp.

vLLM 0.20.2 with the patch set builds GLM-5 from the tiny fixtures' GGUF as ``vllm serve``
does and runs its forward pass (glm5_tools.diagnostics.vllm_forward: the GGUF loader,
GlmMoeDsaForCausalLM, FusedMoE with its real router, the attention backends' own code in
Triton's interpreter; CPU stand-ins, named as such, for the CUDA-only GGUF ops, cache
writes and the indexer's query quantization). Its logits at every prompt position are
compared with llama.cpp's glm-dsa on the same file, and every layer's sub-blocks with the
float32 reference of the GGUF (stage_forward.compare_layers), so that a failure names the
first layer and sub-block that diverges.

Dense path (TRITON_MLA, patch 0004) on the main fixture (index_topk 2048); sparse path
(TRITON_MLA_SPARSE, patch 0011) on the top-k-32 fixture with stage 8's default prompts: one
within a 64-row cache page and index_topk, one past both (the page boundary and the top-k
boundary inside the compared positions), and the longer one's last 5 positions as a decode
step through the persistent_topk path (its CPU stand-in: the exact set, shuffled) and 0011's
sort kernels; the sparse path with the fp8 latent cache (patch 0013, ``--kv-cache-dtype
fp8``: vLLM's fp8_ds_mla layout written by the CPU writer, the model in bfloat16). The fault
patches (devtests/ml/diagnostics/faults, devtests/ml/patches/faults) passed every CPU test
before this one; each fails here with its layer and sub-block named.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / ".cache" / "fixtures"
MAIN = FIXTURES / "tiny-glm5"
TOPK32 = FIXTURES / "tiny-glm5-topk32"
Q4 = "gguf/tiny-glm5-UD-Q4_K_XL.gguf"
FAULTS = REPO / "devtests" / "ml" / "diagnostics" / "faults"
KERNEL_FAULTS = REPO / "devtests" / "ml" / "patches" / "faults"
DENSE_LENGTHS = (12, 24)
FP8_LENGTHS = (40,)  # past index_topk 32 (the pages are the sparse test's: the same index conversion)

needs = pytest.mark.skipif(not (MAIN / Q4).exists() or not (TOPK32 / Q4).exists(),
                           reason="tiny GLM-5 fixtures not built (scripts/make-tiny-glm5 [--index-topk 32 --no-split])")


# --- the comparison's pieces, on numbers small enough to check by hand ---------------------


def _router_tap(ids: list[list[int]], choice: list[list[float]], logits: list[list[float]]) -> dict:
    import torch

    return {"topk_ids": torch.tensor(ids), "choice_scores": torch.tensor(choice),
            "router_logits": torch.tensor(logits), "topk_weights": torch.full((len(ids), len(ids[0])), 0.5)}


def test_router_check_excuses_a_bfloat16_tie_and_names_a_real_difference():
    from glm5_tools.diagnostics.stage_forward import _router

    logits = [[4.0, 1.0, 1.0, 1.0]]
    want = _router_tap([[0, 1]], [[0.9, 0.5, 0.5 - 5e-4, 0.1]], logits)
    tie = _router_tap([[0, 2]], [[0.9, 0.5, 0.5 - 5e-4, 0.1]], logits)
    assert _router(tie, want)[0] == 0.0  # 5e-4 < 2^-11 * (1 + 1): one bfloat16 rounding
    want_far = _router_tap([[0, 1]], [[0.9, 0.5, 0.5 - 2e-3, 0.1]], logits)
    assert _router(tie, want_far)[0] == float("inf")  # 2e-3: what the fixture's bias decides
    wrong = _router_tap([[0, 3]], [[0.9, 0.5, 0.49, 0.1]], logits)
    measured, detail = _router(wrong, want)
    assert measured == float("inf") and "vLLM [0, 3], reference [0, 1]" in detail


def test_selection_check_names_a_shifted_top_k():
    import torch

    from glm5_tools.diagnostics.dsa_reference import causal_mask, shift_selection
    from glm5_tools.diagnostics.stage_forward import _selection

    t = 6
    chosen = causal_mask(t) & (torch.arange(t)[None, :] >= torch.arange(t)[:, None] - 1)  # last two keys
    scores = torch.arange(t * t, dtype=torch.float32).reshape(t, t)
    as_indices = torch.tensor([[j for j in range(t) if chosen[i, j]] + [-1] * (t - int(chosen[i].sum()))
                               for i in range(t)])
    assert _selection(as_indices, chosen, scores)[0] == 0.0
    shifted = shift_selection(chosen, causal_mask(t))
    shifted_idx = torch.tensor([[j for j in range(t) if shifted[i, j]] + [-1] * (t - int(shifted[i].sum()))
                                for i in range(t)])
    measured, detail, equal = _selection(shifted_idx, chosen, scores)
    assert measured > 0 and "top-k selection differs" in detail and not bool(equal.all())


def test_the_fp8_latent_cache_is_refused_for_the_dense_backend_and_an_unknown_dtype_named():
    from glm5_tools.diagnostics import stage_forward

    with pytest.raises(ValueError, match="fp8_ds_mla latent cache is TRITON_MLA_SPARSE's"):
        stage_forward.run_stage(MAIN / Q4, MAIN / "hf", backend="TRITON_MLA", lengths=(12,), kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv cache dtype 'fp8_e5m2'"):
        stage_forward.run_stage(TOPK32 / Q4, TOPK32 / "hf", backend="TRITON_MLA_SPARSE", lengths=(12,),
                                kv_cache_dtype="fp8_e5m2")


@pytest.fixture(scope="module")
def sparse_model():
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    return VllmCpuModel(TOPK32 / Q4, TOPK32 / "hf", "TRITON_MLA_SPARSE", max_model_len=256)


@pytest.fixture(scope="module")
def fp8_model():
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    return VllmCpuModel(TOPK32 / Q4, TOPK32 / "hf", "TRITON_MLA_SPARSE", max_model_len=256, dtype="bfloat16",
                        kv_cache_dtype="fp8")


@pytest.fixture(scope="module")
def dense_model():
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    return VllmCpuModel(MAIN / Q4, MAIN / "hf", "TRITON_MLA", max_model_len=256)


def _stage(fixture: Path, backend: str, lengths: tuple[int, ...], model: object, kv_cache_dtype: str = "auto"):
    from glm5_tools.diagnostics import stage_forward

    result = stage_forward.run_stage(fixture / Q4, fixture / "hf", backend=backend, lengths=lengths, model=model,
                                     kv_cache_dtype=kv_cache_dtype)
    print("\n".join(result.details))
    return result


@needs
def test_the_model_is_vllms_own(sparse_model, dense_model):
    """What runs is vLLM's code: the model class, the backend's impl, the real router."""
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter
    from vllm.model_executor.layers.quantization.gguf import GGUFLinearMethod, GGUFMoEMethod
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAImpl, TritonMLASparseImpl

    assert type(sparse_model.model).__name__ == "GlmMoeDsaForCausalLM"
    layers = sparse_model.model.model.layers
    assert all(isinstance(layer.self_attn.mla_attn.mla_attn.impl, TritonMLASparseImpl) for layer in layers)
    moe = layers[-1].mlp
    assert isinstance(moe.experts.router, GroupedTopKRouter)
    assert moe.experts.router.e_score_correction_bias is not None
    assert isinstance(moe.experts.quant_method, GGUFMoEMethod)
    assert isinstance(layers[0].self_attn.mla_attn.q_b_proj.quant_method, GGUFLinearMethod)
    impl = dense_model.model.model.layers[0].self_attn.mla_attn.mla_attn.impl
    assert type(impl) is TritonMLAImpl


@needs
def test_dense_path_matches_llama_cpp_layer_by_layer(dense_model):
    from glm5_tools.diagnostics.result import Verdict

    result = _stage(MAIN, "TRITON_MLA", DENSE_LENGTHS, dense_model)
    assert result.verdict is Verdict.PASS, result.details
    assert sum("vLLM vs llama.cpp" in d for d in result.details) == len(DENSE_LENGTHS)


@needs
def test_sparse_path_matches_llama_cpp_below_and_above_index_topk_and_a_page(sparse_model):
    from glm5_tools.diagnostics import stage_forward
    from glm5_tools.diagnostics.result import Verdict

    lengths = stage_forward.LENGTHS  # stage 8's defaults
    assert min(lengths) < 32 and max(lengths) > 64 + stage_forward.DECODE_ROWS
    result = _stage(TOPK32, "TRITON_MLA_SPARSE", lengths, sparse_model)
    assert result.verdict is Verdict.PASS, result.details
    assert any("2 cache pages of 64; index_topk 32, passed" in d for d in result.details)
    assert not any(d.startswith("note:") for d in result.details)
    # past index_topk the selection is checked, and it is exact, in 0011's order
    assert any("selection 0.00e+00, order 0.00e+00" in d for d in result.details)
    # the decode step took the persistent_topk path (stand-in, then 0011's sort kernels)
    decode = [d for d in result.details if "decode step of the last 5 positions" in d]
    assert len(decode) == 1 and "persistent_topk" in decode[0], decode
    assert sum("rows ascending, -1 last; selection equal to the prefill's" in d for d in result.details) == 4


@needs
def test_sparse_path_with_the_fp8_latent_cache_matches_llama_cpp(fp8_model):
    """--kv-cache-dtype fp8: vLLM's fp8_ds_mla latent cache (patch 0013) written by the CPU
    writer (test_fp8_ds_mla_writer.py: byte for byte vLLM's), read by 0013's kernel; the model
    in bfloat16 as on a GPU, against the float32 reference with the cache's rounding and
    llama.cpp with the fp8 bound (stage_forward.KL_TOLERANCE_FP8)."""
    from glm5_tools.diagnostics import stage_forward
    from glm5_tools.diagnostics.result import Verdict

    layer = fp8_model.model.model.layers[0].self_attn.mla_attn.mla_attn
    assert layer.kv_cache_dtype == "fp8_ds_mla" and layer.kv_cache.shape[-1] == 656
    result = _stage(TOPK32, "TRITON_MLA_SPARSE", FP8_LENGTHS, fp8_model, kv_cache_dtype="fp8")
    assert result.verdict is Verdict.PASS, result.details
    assert result.tolerance == stage_forward.KL_TOLERANCE_FP8
    assert "fp8_ds_mla latent cache, bfloat16" in result.where


def _stage_on_fault(tmp_path: Path, fault: Path, fixture: Path, backend: str, lengths: str) -> dict:
    """Stage 8 through the diagnostics CLI, in a fresh interpreter whose vLLM is an
    overlay of the patch set plus one fault patch."""
    import overlay
    import warm

    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), fault])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO / "src")])
    out = tmp_path / "report.json"
    proc = warm.run(
        [sys.executable, "-m", "glm5_tools.diagnostics", "--gguf", str(fixture / Q4), "--hf-config",
         str(fixture / "hf"), "--tp", "1", "--device", "cpu", "--stages", "8", "--forward-backend", backend,
         "--forward-lengths", lengths, "--json", str(out)],
        env=env, timeout=900)
    print(proc.stdout[-4000:])
    assert proc.returncode == 1, proc.stderr[-3000:]
    report: dict = json.loads(out.read_text())
    return next(s for s in report["stages"] if s["stage"] == 8)


@needs
@pytest.mark.parametrize(("fault", "fixture", "backend", "lengths", "named"), [
    ("sparse-mla-scale-nope-only.patch", TOPK32, "TRITON_MLA_SPARSE", "24", "layer 0 attention"),
    ("moe-routed-scaling-not-applied.patch", MAIN, "TRITON_MLA", "12", "layer 3 routed experts"),
    ("moe-score-bias-ignored.patch", MAIN, "TRITON_MLA", "12", "layer 3 router"),
])
def test_a_fault_fails_naming_layer_and_sub_block(tmp_path: Path, fault: str, fixture: Path, backend: str,
                                                  lengths: str, named: str):
    stage = _stage_on_fault(tmp_path, FAULTS / fault, fixture, backend, lengths)
    assert stage["verdict"] == "fail"
    assert stage["details"][0].startswith(f"first divergence: {named}"), stage["details"][:3]


@contextmanager
def _sparse_kernels_from(site: Path) -> Iterator[None]:
    """0011/0013's Triton kernels (every ``@triton.jit`` function of sparse_utils.py) taken
    from site's copy of the file (an overlay with a fault patch) in place of the imported
    module's for the block: sparse_utils' functions look their kernels up in its globals at
    each call, so the built model runs the faulted kernels without being rebuilt (a fresh
    interpreter per fault, as above, would build it again: ~40 s of CPU each)."""
    import importlib.util

    from triton.runtime.jit import KernelInterface
    from vllm.v1.attention.backends.mla import sparse_utils

    from glm5_tools.diagnostics.patching import replaced

    path = site / "vllm" / "v1" / "attention" / "backends" / "mla" / "sparse_utils.py"
    spec = importlib.util.spec_from_file_location("glm5_fault_sparse_utils", path)
    assert spec is not None and spec.loader is not None
    faulted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faulted)
    # @triton.jit functions (under Triton's interpreter: InterpretedFunction, a KernelInterface)
    kernels = {name: obj for name, obj in vars(faulted).items() if isinstance(obj, KernelInterface)}
    assert kernels and set(kernels) <= set(vars(sparse_utils))
    with replaced(sparse_utils, **kernels):
        yield


@pytest.fixture(scope="module")
def llama_once():
    """llama.cpp's logits, computed once per prompt for the module's stage runs."""
    from glm5_tools.diagnostics.stage_forward import llama_cpp_logits

    seen: dict[tuple[str, tuple[int, ...]], Any] = {}

    def logits(path: Path, tokens: list[int]) -> Any:
        key = (str(path), tuple(tokens))
        if key not in seen:
            seen[key] = llama_cpp_logits(path, tokens)
        return seen[key]

    return logits


@needs
@pytest.mark.parametrize(("fault", "model", "kv_cache_dtype", "lengths", "named"), [
    # past the indexer cache's first page only: what the longer default prompt is for
    (FAULTS / "indexer-scale-at-request-position.patch", "sparse_model", "auto", (72,),
     "layer 0 sparse attention top-k selection"),
    # the decode step's sort after persistent_topk (the set unchanged)
    (FAULTS / "topk-sort-pads-first.patch", "sparse_model", "auto", (8,), "layer 0 top-k selection order"),
    # 0013's fp8 kernel reading the next tile's scale, in the whole model
    (KERNEL_FAULTS / "fp8-scale-of-next-tile.patch", "fp8_model", "fp8", (8,), "layer 0 attention"),
], ids=lambda v: v.name if isinstance(v, Path) else None)
def test_a_fault_in_the_sparse_kernels_fails_naming_layer_and_sub_block(
        tmp_path: Path, request: pytest.FixtureRequest, llama_once: Any, fault: Path, model: str,
        kv_cache_dtype: str, lengths: tuple[int, ...], named: str):
    import overlay

    from glm5_tools.diagnostics import stage_forward
    from glm5_tools.diagnostics.result import Verdict

    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), fault])
    built = request.getfixturevalue(model)
    with _sparse_kernels_from(site):
        result = stage_forward.run_stage(TOPK32 / Q4, TOPK32 / "hf", backend="TRITON_MLA_SPARSE", lengths=lengths,
                                         model=built, kv_cache_dtype=kv_cache_dtype, llama=llama_once)
    print("\n".join(result.details))
    assert result.verdict is Verdict.FAIL
    assert result.details[0].startswith(f"first divergence: {named}"), result.details[:3]
