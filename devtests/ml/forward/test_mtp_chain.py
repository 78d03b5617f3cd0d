"""vLLM's target, MTP drafter and speculative-decoding loop on the constructed chain fixture, on the CPU.

glm5_tools.fixtures.mtp_chain rewrites the small-top-k fixture's GGUF so that the greedy
next token after x is pi(x) (one cycle through the non-special tokens) with a large margin,
and a correct GLM NextN drafter drafts pi of its input at every chained step (docs/fixtures.md
"The MTP chain fixture"). vLLM (patch set, TRITON_MLA_SPARSE, ``--speculative-config`` mtp
with 3 tokens) loads it as it loads the fixture; after a 40-token prompt (past index_topk 32,
so the indexers select):

* the target follows pi at every position and the drafter's chain (VllmCpuModel.draft, no
  proposer) is its greedy continuation, each with a top-1/top-2 log-prob margin of at least
  MIN_MARGIN;
* vLLM's own loop (glm5_tools.diagnostics.spec_loop: EagleProposer with its first-pass input
  setup and propose, the target's verification of the drafts, the RejectionSampler, the
  padded drafter batch's bookkeeping) accepts every draft at every position and generates
  exactly what greedy decoding without MTP generates; its first proposal's drafter logits
  equal the chain's above bit for bit;
* with drafts that are wrong (a drafter wrong at its third position; the raw hidden state
  carried, DeepSeek's way and the known GLM NextN collapse; enorm/hnorm swapped) the loop
  still generates greedy decoding's tokens, with the acceptance per position each implies;
* fault patches in vLLM's loop (devtests/ml/diagnostics/faults/spec-*.patch and
  rejection-*.patch) fail it, each named by the first thing spec_loop.check finds: loaded
  from a patched overlay of the installed vLLM into this interpreter in place of the
  loop's modules (the model stays built: the faults are in the loop's code, not the model's).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
TOPK32 = REPO / ".cache" / "fixtures" / "tiny-glm5-topk32"
Q4 = "gguf/tiny-glm5-UD-Q4_K_XL.gguf"
FAULTS = REPO / "devtests" / "ml" / "diagnostics" / "faults"
SPEC = {"method": "mtp", "num_speculative_tokens": 3}
MIN_MARGIN = 10.0  # log-prob top-1 minus top-2; measured ~25 (docs/fixtures.md)
GENERATE = 9  # tokens: the prefill's and two verifications of 3 accepted drafts + 1
# vLLM's modules the loop runs, in import order (a fault test loads patched copies of them)
LOOP_MODULES = ("vllm.v1.spec_decode.utils", "vllm.v1.spec_decode.llm_base_proposer",
                "vllm.v1.spec_decode.eagle", "vllm.v1.sample.rejection_sampler")

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


@pytest.fixture(scope="module")
def chain_run(model: Any, prompt: list[int]) -> Any:
    """The target's prefill and the drafter's chain after it, driven without the proposer."""
    return model.draft(prompt)


@pytest.fixture(scope="module")
def loop(model: Any) -> Any:
    from glm5_tools.diagnostics.spec_loop import SpecLoop

    return SpecLoop(model)


@pytest.fixture(scope="module")
def greedy(loop: Any, prompt: list[int]) -> Any:
    """Greedy decoding without MTP: the same engine steps, one target token each."""
    return loop.generate(prompt, GENERATE, speculative=False)


def _margins(logits: Any) -> Any:
    import torch

    top = torch.log_softmax(logits.float(), -1).topk(2, -1).values
    return top[..., 0] - top[..., 1]


def test_the_target_follows_the_cycle_with_a_large_margin(chain_run: Any, prompt: list[int], successor: Any,
                                                          greedy: Any):
    import torch

    from glm5_tools.fixtures.mtp_chain import continuation

    logits = chain_run.target_logits
    want = successor[torch.tensor(prompt)]
    margins = _margins(logits)
    print(f"target: {int((logits.argmax(-1) == want).sum())}/{len(prompt)} positions follow pi, "
          f"margin min {float(margins.min()):.2f} median {float(margins.median()):.2f}")
    assert torch.equal(logits.argmax(-1), want)
    assert float(margins.min()) >= MIN_MARGIN
    # greedy decoding without MTP continues the cycle (the loop's own prefill agrees)
    first = int(successor[prompt[-1]])
    assert greedy.tokens[:GENERATE] == [first, *continuation(successor, first, GENERATE - 1)]
    assert torch.equal(greedy.prompt_logits.argmax(-1), want)


def test_every_draft_step_predicts_the_targets_continuation(chain_run: Any, prompt: list[int], successor: Any):
    from glm5_tools.fixtures.mtp_chain import continuation

    want = continuation(successor, chain_run.next_token, len(chain_run.drafted))
    assert chain_run.next_token == int(successor[prompt[-1]])
    margins = [round(float(_margins(lg)), 2) for lg in chain_run.logits]
    print(f"drafted {chain_run.drafted}, target's continuation {want}, margins {margins}")
    assert chain_run.drafted == want
    assert min(margins) >= MIN_MARGIN


def _report(gen: Any, problems: list[str]) -> None:
    for step in gen.steps:
        print(f"scheduled {step.scheduled[-4:]} ({step.num_drafts} drafts) -> sampled {step.sampled}, "
              f"proposed {step.proposed}")
    print(f"acceptance per position {gen.accepted_per_position} of {gen.num_drafts}; problems: {problems}")


def test_vllms_mtp_loop_accepts_every_draft_and_equals_greedy_decoding(loop: Any, prompt: list[int],
                                                                      greedy: Any, chain_run: Any):
    from glm5_tools.diagnostics.spec_loop import check

    gen = loop.generate(prompt, GENERATE)
    problems = check(gen, greedy, expected_acceptance=[1.0, 1.0, 1.0], reference=chain_run.logits)
    _report(gen, problems)
    assert problems == []
    assert gen.num_drafts == 2 and gen.accepted_per_position == [2, 2, 2]
    assert gen.tokens == greedy.tokens  # 1 + 2 x 4 tokens in three target steps, against nine


@contextmanager
def _drafter_wrong_at_position_2(model: Any) -> Iterator[None]:
    """A drafter that is wrong at its third draft position only: the real drafter's logits
    with its top token removed at every third call (the proposer computes the logits once
    per draft step, positions 0, 1, 2 in turn), so the verification rejects there and
    accepts the two drafts before it."""
    drafter = model.drafter
    real = drafter.compute_logits
    calls = [0]

    def wrong_at_2(hidden: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        out = real(hidden, *args, **kwargs)
        if calls[0] % 3 == 2:
            out = out.clone()
            out[torch.arange(out.shape[0]), out.argmax(-1)] = float("-inf")
        calls[0] += 1
        return out

    drafter.compute_logits = wrong_at_2
    try:
        yield
    finally:
        del drafter.compute_logits


@contextmanager
def _norm_not_carried(model: Any) -> Iterator[None]:
    """mtp-shared-head-norm-not-carried.patch's effect on the loaded drafter."""
    layer = model.drafter.model.layers["4"]
    assert layer.norm_carried
    layer.norm_carried = False
    try:
        yield
    finally:
        layer.norm_carried = True


@contextmanager
def _enorm_hnorm_swapped(model: Any) -> Iterator[None]:
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


# drafter, tokens to generate, the acceptance per position it implies on the chain fixture
SCENARIOS = {
    "wrong_at_2": (_drafter_wrong_at_position_2, 7, [1.0, 1.0, 0.0]),
    "norm_not_carried": (_norm_not_carried, 5, [1.0, 0.0, 0.0]),
    "enorm_hnorm_swapped": (_enorm_hnorm_swapped, 2, [0.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rejected_drafts_still_give_greedy_decodings_tokens(loop: Any, model: Any, prompt: list[int],
                                                            greedy: Any, scenario: str):
    """Rejection at position 2, 1 and 0: the rejection sampler's recovered token, the
    padded drafter batch after a rejection (prepare_next_token_ids_padded,
    prepare_inputs_padded) and the chained steps' shortened sequences. The last two are
    the GLM NextN faults the fixture was made to show (from step 1; at step 0)."""
    from glm5_tools.diagnostics.spec_loop import check

    drafter, n, acceptance = SCENARIOS[scenario]
    with drafter(model):
        gen = loop.generate(prompt, n)
    problems = check(gen, greedy, expected_acceptance=acceptance)
    _report(gen, problems)
    assert problems == []
    assert gen.num_drafts >= 1


@contextmanager
def _loop_modules_from(site: Path) -> Iterator[None]:
    """LOOP_MODULES executed from site's files (an overlay with a fault patch) in place of the
    imported ones while a SpecLoop is made (it looks them up then), then put back."""
    saved = {name: sys.modules.get(name) for name in LOOP_MODULES}
    try:
        for name in LOOP_MODULES:
            spec = importlib.util.spec_from_file_location(name, site / (name.replace(".", "/") + ".py"))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@pytest.mark.parametrize(("fault", "scenario", "n", "named"), [
    ("spec-first-pass-ids-not-shifted.patch", None, 2, "first proposal, draft step 0:"),
    ("spec-chain-position-not-advanced.patch", None, 2, "first proposal, draft step 1:"),
    ("spec-padded-sample-ignores-rejections.patch", "wrong_at_2", 7, "acceptance at draft position 0:"),
    ("rejection-greedy-emits-rejected-draft.patch", "wrong_at_2", 7, "generated token 3:"),
])
def test_a_fault_in_vllms_loop_fails_it_named(tmp_path: Path, model: Any, prompt: list[int], greedy: Any,
                                              chain_run: Any, fault: str, scenario: str | None, n: int,
                                              named: str):
    import overlay

    from glm5_tools.diagnostics.spec_loop import SpecLoop, check

    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), FAULTS / fault])
    clean = sys.modules["vllm.v1.spec_decode.eagle"].EagleProposer
    with _loop_modules_from(site):
        faulted = SpecLoop(model)
    assert type(faulted.proposer) is not clean and sys.modules["vllm.v1.spec_decode.eagle"].EagleProposer is clean
    if scenario is None:
        gen = faulted.generate(prompt, n)
        problems = check(gen, greedy, expected_acceptance=[1.0, 1.0, 1.0], reference=chain_run.logits)
    else:
        drafter, _, acceptance = SCENARIOS[scenario]
        with drafter(model):
            gen = faulted.generate(prompt, n)
        problems = check(gen, greedy, expected_acceptance=acceptance)
    _report(gen, problems)
    assert problems, f"{fault} passed the loop's checks"
    assert problems[0].startswith(named), problems
