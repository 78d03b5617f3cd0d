"""GLM-5's MTP drafter as vLLM builds it from the GGUF, on the CPU.

vLLM 0.20.2 with the patch set (0012) is given ``--speculative-config '{"method": "mtp",
"num_speculative_tokens": 3}'`` on the small-top-k fixture's GGUF with TRITON_MLA_SPARSE;
the drafter is built and loaded as vLLM's proposer does it and drafts a greedy chain of 3
tokens after a 40-token prompt (longer than the fixture's index_topk 32, so the MTP layer's
own indexer selects). Each step's logits are compared with the float32 NextN reference
(diagnostics stage 9, glm5_tools.diagnostics.stage_mtp). Two fault patches
(devtests/ml/diagnostics/faults/mtp-*.patch) fail it, each naming its draft step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOPK32 = REPO / ".cache" / "fixtures" / "tiny-glm5-topk32"
Q4 = "gguf/tiny-glm5-UD-Q4_K_XL.gguf"
FAULTS = REPO / "devtests" / "ml" / "diagnostics" / "faults"
SPEC = {"method": "mtp", "num_speculative_tokens": 3}

needs = pytest.mark.skipif(not (TOPK32 / Q4).exists(),
                           reason="tiny GLM-5 top-k-32 fixture not built (scripts/make-tiny-glm5 --index-topk 32 "
                                  "--no-split)")


def test_verdict_names_the_first_step_that_diverges():
    import torch

    from glm5_tools.diagnostics.result import Verdict
    from glm5_tools.diagnostics.stage_mtp import compare_chain, verdict

    ref = [torch.tensor([0.0, 1.0, 3.0]), torch.tensor([2.0, 0.0, 1.0])]
    carried = [torch.ones(4), torch.ones(4)]
    same = compare_chain([r.clone() for r in ref], carried, [5, 7], ref, carried)
    assert verdict(same, "here").verdict is Verdict.PASS
    drift = [ref[0].clone(), torch.tensor([0.0, 2.5, 1.0])]  # step 1's argmax moves
    failed = verdict(compare_chain(drift, carried, [5, 7], ref, carried), "here")
    assert failed.verdict is Verdict.FAIL
    assert failed.details[0].startswith("first divergence: draft step 1"), failed.details
    close = [ref[0] + 1e-4, ref[1]]  # within tolerance, same argmax
    assert verdict(compare_chain(close, carried, [5, 7], ref, carried), "here").verdict is Verdict.PASS
    tie_break = [torch.tensor([0.0, 3.0, 3.0001]), ref[1]]  # tiny change, other argmax: still a failure
    bad = verdict(compare_chain(tie_break, carried, [5, 7], [torch.tensor([0.0, 3.0001, 3.0]), ref[1]],
                                carried), "here")
    assert bad.verdict is Verdict.FAIL and bad.measured == float("inf")


@pytest.fixture(scope="module")
def mtp_model():
    from glm5_tools.diagnostics.vllm_forward import VllmCpuModel

    return VllmCpuModel(TOPK32 / Q4, TOPK32 / "hf", "TRITON_MLA_SPARSE", max_model_len=256,
                        speculative_config=SPEC)


@needs
def test_the_drafter_is_vllms_deepseek_mtp_with_glm_weights(mtp_model):
    """The drafter is vLLM's DeepSeekMTP with the GGUF's NextN weights (not their initial
    values), the shared head carries its norm, and it shares the target's embedding and LM
    head as vLLM's proposer arranges."""
    import torch
    from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLASparseImpl

    from glm5_tools.diagnostics.dsa_reference import GlmDsaReference

    drafter = mtp_model.drafter
    assert isinstance(drafter, DeepSeekMTP)
    assert mtp_model.vllm_config.speculative_config.method == "mtp"
    assert mtp_model.vllm_config.speculative_config.draft_model_config.hf_config.model_type == "deepseek_mtp"
    layer = drafter.model.layers["4"]
    assert layer.norm_carried
    ref = GlmDsaReference(TOPK32 / Q4)
    for ours, gguf in ((layer.enorm.weight, "blk.4.nextn.enorm.weight"),
                       (layer.hnorm.weight, "blk.4.nextn.hnorm.weight"),
                       (layer.shared_head.norm.weight, "blk.4.nextn.shared_head_norm.weight"),
                       (layer.eh_proj.weight, "blk.4.nextn.eh_proj.weight"),
                       (layer.mtp_block.input_layernorm.weight, "blk.4.attn_norm.weight")):
        want = ref.w(gguf)
        assert not torch.equal(want, torch.ones_like(want)), gguf
        assert torch.allclose(ours.float(), want, rtol=0, atol=0), gguf
    assert layer.shared_head.head is mtp_model.model.lm_head
    assert drafter.model.embed_tokens is mtp_model.model.model.embed_tokens
    assert isinstance(layer.mtp_block.self_attn.mla_attn.mla_attn.impl, TritonMLASparseImpl)
    assert layer.mtp_block.self_attn.indexer is not None


@needs
def test_three_draft_steps_match_the_float32_nextn_layer(mtp_model):
    from glm5_tools.diagnostics.result import Verdict
    from glm5_tools.diagnostics.stage_mtp import run_check

    result = run_check(TOPK32 / Q4, TOPK32 / "hf", length=40, num_speculative_tokens=3, model=mtp_model)
    print("\n".join(result.details))
    assert result.verdict is Verdict.PASS, result.details
    assert sum(d.startswith("draft step") for d in result.details) == 3


@needs
def test_verification_step_of_1_plus_n_tokens_takes_the_sparse_path(mtp_model):
    """The target's verification of N drafts is one step of 1 + N tokens per request, which
    the indexer's metadata builder (reorder threshold 1 + N with a speculative config)
    treats as decode tokens; 0011 refused that. Run as such a step after a prefill, the
    last 4 positions of a 40-token prompt (past index_topk 32) give the logits of the
    whole-prompt prefill."""
    import torch
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    from glm5_tools.diagnostics.stage_forward import prompt_tokens

    tokens = prompt_tokens(40, 1, 2048)
    whole = mtp_model.forward(tokens)
    seen: list[int] = []
    indexer = next(m for m in mtp_model.model.modules() if isinstance(m, SparseAttnIndexer))
    real = indexer.forward_cuda

    def spy(*args, **kwargs):
        from vllm.forward_context import get_forward_context

        meta = get_forward_context().attn_metadata[indexer.k_cache.prefix]
        seen.append(int(meta.num_decode_tokens))
        return real(*args, **kwargs)

    indexer._forward_method = spy
    try:
        tail = mtp_model.forward_tail(tokens, 4)
    finally:
        indexer._forward_method = real
    assert seen == [0, 4], seen  # the prefill, then 4 decode tokens of one request
    rel = float((tail - whole[-4:]).norm() / whole[-4:].norm())
    assert rel < 1e-4, rel
    assert torch.equal(tail.argmax(-1), whole[-4:].argmax(-1))


def _stage9_on_fault(tmp_path: Path, fault: str) -> dict:
    """Stage 9 through the diagnostics CLI, in a fresh interpreter whose vLLM is an overlay
    of the patch set plus one fault patch."""
    import overlay
    import warm

    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), FAULTS / fault])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO / "src")])
    out = tmp_path / "report.json"
    proc = warm.run(
        [sys.executable, "-m", "glm5_tools.diagnostics", "--gguf", str(TOPK32 / Q4), "--hf-config",
         str(TOPK32 / "hf"), "--tp", "1", "--device", "cpu", "--stages", "9", "--mtp-tokens", "3",
         "--mtp-length", "40", "--json", str(out)],
        env=env, timeout=900)
    print(proc.stdout[-4000:])
    assert proc.returncode == 1, proc.stderr[-3000:]
    report: dict = json.loads(out.read_text())
    return next(s for s in report["stages"] if s["stage"] == 9)


@needs
@pytest.mark.parametrize(("fault", "step"), [
    ("mtp-shared-head-norm-not-carried.patch", 1),
    ("mtp-enorm-hnorm-swapped.patch", 0),
])
def test_a_fault_fails_naming_its_draft_step(tmp_path: Path, fault: str, step: int):
    stage = _stage9_on_fault(tmp_path, fault)
    assert stage["verdict"] == "fail"
    assert stage["details"][0].startswith(f"first divergence: draft step {step} "), stage["details"][:4]
