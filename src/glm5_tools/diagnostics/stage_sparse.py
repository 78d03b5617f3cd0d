"""Stage 7: GLM-5's sparse attention (DSA) selection, CPU reference against llama.cpp.

The stage runs the whole GGUF twice over prompts of several times ``index_topk`` tokens:
through this project's CPU reference (``dsa_reference``: indexer -> causal top-k -> MLA
over the selected keys, float32, no GPU kernel anywhere) and through llama.cpp's
``glm-dsa`` (an implementation by other people). It passes when the two agree (mean KL
within ``tolerance``) *and* the prompts discriminate: the dense computation (every
earlier key, what patch 0004's dense path computes) and an off-by-one selection must
each be at least ``DISCRIMINATION`` times further from llama.cpp than the reference is.
Without the second condition a prompt shorter than top-k would pass any selection.

What it localizes: a disagreement here is a fault of *selection* (top-k size, causality,
indexer RoPE layout, indexer weights as the GGUF stores them), found with exact
attention over the selection, so no attention kernel is involved; stage 5 checks the
kernels with given inputs. ``selection_fault`` injects a fault into the candidate
(``shift``, ``causal``, ``rope_halves``) so the stage can be shown to fail.

It needs llama.cpp's Python bindings (``scripts/make-tiny-glm5`` builds them) and a
GGUF small enough for a float32 CPU forward (``MAX_GGUF_BYTES``): the tiny fixtures,
not GLM-5's 400 GB file; otherwise it is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from glm5_tools.diagnostics.dsa_reference import Agreement, GlmDsaReference, SelectionFault, agreement
from glm5_tools.diagnostics.gguf_io import gguf_files
from glm5_tools.diagnostics.result import StageResult, Verdict

STAGE = 7
NAME = "sparse attention selection"
TOLERANCE = 0.03  # mean KL in nats; docs/diagnostics.md "Sparse attention reference"
DISCRIMINATION = 10.0
MAX_GGUF_BYTES = 2 * 1024**3
DEFAULT_MULTIPLES = (4, 8)

LlamaLogits = Callable[[Path, list[int]], torch.Tensor]


def prompt_tokens(n: int, seed: int, vocab: int) -> list[int]:
    """A seeded prompt of n token ids below ``vocab``."""
    if n < 2:
        raise ValueError(f"prompt length {n}: at least 2 tokens")
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, n)]


def llama_cpp_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    """llama.cpp's logits at every position (the bindings built by scripts/make-tiny-glm5)."""
    from glm5_tools.fixtures.locate import use_llama_cpp
    from glm5_tools.fixtures.reference import reference_logits

    use_llama_cpp()
    return torch.from_numpy(reference_logits(path, tokens, n_ctx=max(512, len(tokens) + 8)).logits)


def _llama_cpp_available() -> str | None:
    try:
        from glm5_tools.fixtures.locate import use_llama_cpp

        use_llama_cpp()
        import llama_cpp  # noqa: F401
    except (ImportError, FileNotFoundError, OSError) as exc:
        return f"llama.cpp's bindings are not importable ({exc}); scripts/make-tiny-glm5 builds them"
    return None


def _fmt(a: Agreement) -> str:
    return f"top-1 {a.top1:.3f}, KL {a.kl_mean:.4g}"


def run_stage(
    gguf: Path,
    *,
    multiples: Sequence[int] = DEFAULT_MULTIPLES,
    seed: int = 0,
    selection_fault: SelectionFault = "none",
    llama: LlamaLogits | None = None,
    tolerance: float = TOLERANCE,
) -> StageResult:
    """Compare the reference's sparse attention with llama.cpp's over prompts of
    ``multiples`` x index_topk tokens."""
    if not multiples or min(multiples) < 2:
        raise ValueError(f"multiples {list(multiples)}: prompts must be at least 2 x index_topk")
    files = gguf_files(Path(gguf))
    size = sum(f.stat().st_size for f in files)
    if size > MAX_GGUF_BYTES:
        return StageResult.skip(STAGE, NAME, f"{size / 1024**3:.0f} GiB GGUF: the CPU reference runs the whole "
                                "model in float32; run this stage on the tiny fixtures (docs/diagnostics.md)")
    if llama is None:
        missing = _llama_cpp_available()
        if missing:
            return StageResult.skip(STAGE, NAME, missing)
        llama = llama_cpp_logits
    if len(files) != 1:
        return StageResult.skip(STAGE, NAME, "a split GGUF: run the stage on a single-file GGUF")
    path = files[0]
    model = GlmDsaReference(path)
    topk = model.hp.index_topk
    details = [f"index_topk {topk} (GGUF), {model.hp.n_layer} layers, selection fault: {selection_fault}"]
    worst = 0.0
    failed: list[str] = []
    for i, m in enumerate(multiples):
        n = m * topk
        toks = prompt_tokens(n, seed + i, model.n_vocab)
        ref = llama(path, toks)
        got = agreement(model.forward(toks, selection_fault=selection_fault).logits, ref, start=topk)
        dense = agreement(model.forward(toks, attention="dense").logits, ref, start=topk)
        shift = got if selection_fault == "shift" else agreement(
            model.forward(toks, selection_fault="shift").logits, ref, start=topk)
        worst = max(worst, got.kl_mean)
        details.append(f"{n} tokens ({m} x top-k), positions {topk}..{n - 1}: candidate {_fmt(got)}; "
                       f"dense {_fmt(dense)}; off-by-one {_fmt(shift)}")
        floor = max(got.kl_mean, 1e-6) * DISCRIMINATION
        if selection_fault == "none" and min(dense.kl_mean, shift.kl_mean) < floor:
            failed.append(f"{n} tokens: dense or off-by-one selection within {DISCRIMINATION:g}x of the "
                          "candidate's KL; these prompts cannot tell a selection fault")
    details += failed
    result = StageResult.judge(STAGE, NAME, worst, tolerance,
                               "cpu: reference (indexer, top-k, exact MLA) vs llama.cpp glm-dsa", details)
    if failed and result.verdict is Verdict.PASS:
        result.verdict = Verdict.FAIL
    return result
