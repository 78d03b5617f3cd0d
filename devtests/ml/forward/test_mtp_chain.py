"""vLLM's target and MTP drafter on the constructed chain fixture, on the CPU.

glm5_tools.fixtures.mtp_chain rewrites the small-top-k fixture's GGUF so that the greedy
next token after x is pi(x) (one cycle through the non-special tokens) with a large margin,
and a correct GLM NextN drafter drafts pi of its input at every chained step (docs/fixtures.md
"The MTP chain fixture"). vLLM (patch set, TRITON_MLA_SPARSE, ``--speculative-config`` mtp
with 3 tokens) loads it as it loads the fixture; after a 40-token prompt (past index_topk 32,
so the indexers select) the target must follow pi at every position and the drafter's chain
must be the target's greedy continuation, each with a top-1/top-2 log-prob margin of at
least MIN_MARGIN. Two drafter faults, injected into the loaded modules as the fault patches
of devtests/ml/diagnostics/faults/ inject them into the source, must break the chain at the
step the fault reaches: the raw hidden state carried (DeepSeek's way; the known GLM NextN
collapse after the first drafted position) from step 1, enorm/hnorm swapped from step 0.
About 2 min on the 2-core machine (one model build, 4 drafts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
TOPK32 = REPO / ".cache" / "fixtures" / "tiny-glm5-topk32"
Q4 = "gguf/tiny-glm5-UD-Q4_K_XL.gguf"
SPEC = {"method": "mtp", "num_speculative_tokens": 3}
MIN_MARGIN = 10.0  # log-prob top-1 minus top-2; measured ~25 (docs/fixtures.md)

pytestmark = pytest.mark.skipif(not (TOPK32 / Q4).exists(),
                                reason="tiny GLM-5 top-k-32 fixture not built (scripts/make-tiny-glm5 "
                                       "--index-topk 32 --no-split)")


@pytest.fixture(scope="module")
def chain_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from glm5_tools.fixtures.mtp_chain import construct

    out = tmp_path_factory.mktemp("mtp-chain") / "tiny-glm5-mtp-chain.gguf"
    construct(TOPK32 / Q4, out)
    return out


@pytest.fixture(scope="module")
def successor() -> Any:
    import torch

    from glm5_tools.fixtures.mtp_chain import make_chain

    return torch.from_numpy(make_chain(2048, 256).successor)


@pytest.fixture(scope="module")
def model(chain_gguf: Path) -> Any:
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    return VllmCpuModel(chain_gguf, TOPK32 / "hf", "TRITON_MLA_SPARSE", max_model_len=256,
                        speculative_config=SPEC)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    from glm5_tools.diagnostics.stage_forward import prompt_tokens

    return prompt_tokens(40, 1, 2048)


def _margins(logits: Any) -> Any:
    import torch

    top = torch.log_softmax(logits.float(), -1).topk(2, -1).values
    return top[..., 0] - top[..., 1]


def test_the_target_follows_the_cycle_with_a_large_margin(model: Any, prompt: list[int], successor: Any):
    import torch

    logits = model.forward(prompt)
    want = successor[torch.tensor(prompt)]
    margins = _margins(logits)
    print(f"target: {int((logits.argmax(-1) == want).sum())}/{len(prompt)} positions follow pi, "
          f"margin min {float(margins.min()):.2f} median {float(margins.median()):.2f}")
    assert torch.equal(logits.argmax(-1), want)
    assert float(margins.min()) >= MIN_MARGIN


def _draft(model: Any, prompt: list[int], successor: Any) -> tuple[list[bool], list[float]]:
    run = model.draft(prompt)
    from glm5_tools.fixtures.mtp_chain import continuation

    want = continuation(successor, run.next_token, len(run.drafted))
    assert run.next_token == int(successor[prompt[-1]])
    margins = [round(float(_margins(lg)), 2) for lg in run.logits]
    hits = [d == w for d, w in zip(run.drafted, want, strict=True)]
    print(f"drafted {run.drafted}, target's continuation {want}, margins {margins}")
    return hits, margins


def test_every_draft_step_predicts_the_targets_continuation(model: Any, prompt: list[int], successor: Any):
    hits, margins = _draft(model, prompt, successor)
    assert hits == [True, True, True]
    assert min(margins) >= MIN_MARGIN


@pytest.fixture
def norm_not_carried(model: Any) -> Iterator[None]:
    """mtp-shared-head-norm-not-carried.patch's effect on the loaded drafter."""
    layer = model.drafter.model.layers["4"]
    assert layer.norm_carried
    layer.norm_carried = False
    try:
        yield
    finally:
        layer.norm_carried = True


@pytest.fixture
def enorm_hnorm_swapped(model: Any) -> Iterator[None]:
    """mtp-enorm-hnorm-swapped.patch's effect: each half normalized with the other's weight."""
    layer = model.drafter.model.layers["4"]
    e, h = layer.enorm.weight.data.clone(), layer.hnorm.weight.data.clone()
    layer.enorm.weight.data.copy_(h)
    layer.hnorm.weight.data.copy_(e)
    try:
        yield
    finally:
        layer.enorm.weight.data.copy_(e)
        layer.hnorm.weight.data.copy_(h)


def test_raw_hidden_state_carried_breaks_the_chain_from_step_1(model: Any, prompt: list[int], successor: Any,
                                                               norm_not_carried: None):
    hits, _ = _draft(model, prompt, successor)
    assert hits == [True, False, False]


def test_enorm_hnorm_swapped_breaks_the_chain_at_step_0(model: Any, prompt: list[int], successor: Any,
                                                        enorm_hnorm_swapped: None):
    hits, _ = _draft(model, prompt, successor)
    assert not hits[0]
