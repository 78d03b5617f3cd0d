"""GLM-5's MTP drafter as vLLM builds it for speculative decoding, against a float32 NextN layer.

vLLM (with the patch set) is given ``--speculative-config '{"method": "mtp",
"num_speculative_tokens": N}'`` on the GGUF, builds and loads the drafter as its proposer
does (``vllm_forward.VllmCpuModel``: the draft config, the GGUF loader, ``DeepSeekMTP``, the
proposer's sharing of the target's embedding and head) and drafts a greedy chain of N tokens
after a prompt (``VllmCpuModel.draft``). The float32 reference (``dsa_reference.draft_chain``:
gguf-py's dequantization of the file's ``blk.N.*`` / ``blk.N.nextn.*`` tensors) runs the same
chain on the same inputs: the target's hidden states vLLM handed the drafter, the same
token after each step. Each step's logits must agree (relative L2 error and the same argmax):
a failure names the first step that diverges. Step 0 checks the layer's weights and their
mapping (enorm/hnorm, eh_proj, the decoder block, the shared head); steps 1+ check what one
step hands the next (the GLM NextN shared-head norm: without it the carried hidden state is
unnormalized and only steps 1+ diverge).

Diagnostics stage 9 (``python -m glm5_tools.diagnostics --stages 9 --device cpu``).
CPU only (Triton's interpreter, the named CPU stand-ins of vllm_forward). The engine-level
results (greedy equality with and without MTP, acceptance per position) need a GPU run:
docs/validation/e2e-gpu/mtp/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glm5_tools.diagnostics.result import StageResult, Verdict

STAGE = 9
NAME = "MTP drafter (vLLM) vs float32 NextN"
REL_TOL = 1e-2  # float32 on both sides; measured ~1e-3 (fp8 indexer keys, summation order)


@dataclass(frozen=True)
class StepReport:
    step: int
    token_in: int
    rel: float
    top1_vllm: int
    top1_ref: int
    carried_rel: float

    @property
    def ok(self) -> bool:
        return self.rel <= REL_TOL and self.top1_vllm == self.top1_ref

    def line(self) -> str:
        return (f"draft step {self.step} (position {self.step + 1} of the chain, token in {self.token_in}): "
                f"logits rel {self.rel:.2e}, top-1 vLLM {self.top1_vllm} / reference {self.top1_ref}, "
                f"carried hidden rel {self.carried_rel:.2e}")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30))


def compare_chain(logits: list[torch.Tensor], carried: list[torch.Tensor], inputs: list[int],
                  ref_logits: list[torch.Tensor], ref_carried: list[torch.Tensor]) -> list[StepReport]:
    """Per draft step: vLLM's logits [V] and carried hidden state [d] against the reference's."""
    if not (len(logits) == len(carried) == len(inputs) == len(ref_logits) == len(ref_carried)):
        raise ValueError("compare_chain: vLLM and the reference ran different numbers of steps")
    return [StepReport(step=k, token_in=inputs[k], rel=_rel(logits[k], ref_logits[k]),
                       top1_vllm=int(logits[k].argmax()), top1_ref=int(ref_logits[k].argmax()),
                       carried_rel=_rel(carried[k], ref_carried[k]))
            for k in range(len(logits))]


def verdict(reports: list[StepReport], where: str) -> StageResult:
    """pass when every draft step agrees; the first detail line names the first that does not."""
    details = [r.line() for r in reports]
    if not reports:
        return StageResult(STAGE, NAME, Verdict.FAIL, float("inf"), REL_TOL, where, ["no draft step ran"])
    worst = max(r.rel for r in reports)
    bad = [r for r in reports if not r.ok]
    if not bad:
        return StageResult(STAGE, NAME, Verdict.PASS, worst, REL_TOL, where,
                           [f"{len(reports)} draft steps agree", *details])
    first = bad[0]
    what = ("the NextN layer itself (its weights and their mapping, enorm/hnorm, the decoder block, "
            "the shared head)" if first.step == 0 else
            "what one draft step hands the next (the carried hidden state); the steps before it agree")
    head = (f"first divergence: draft step {first.step} (logits rel {first.rel:.2e}, top-1 "
            f"{first.top1_vllm} vs {first.top1_ref}): {what}")
    # a top-1 change within the tolerance still fails: measured past it
    return StageResult(STAGE, NAME, Verdict.FAIL, worst if worst > REL_TOL else float("inf"),
                       REL_TOL, where, [head, *details])


def run_check(gguf: Path, hf_dir: Path, *, backend: str = "TRITON_MLA_SPARSE", length: int = 40,
              num_speculative_tokens: int = 3, seed: int = 0, model: Any = None) -> StageResult:
    """Build (unless given) vLLM's model with the MTP drafter, draft after a prompt of
    ``length`` tokens and compare every step with the reference."""
    from glm5_tools.diagnostics.dsa_reference import Attention, GlmDsaReference
    from glm5_tools.diagnostics.gguf_io import gguf_files
    from glm5_tools.diagnostics.stage_forward import MAX_GGUF_BYTES, prompt_tokens
    from glm5_tools.diagnostics.vllm_forward import BACKENDS, VllmCpuModel

    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r}: stage 9 runs {', '.join(BACKENDS)}")
    files = gguf_files(gguf)
    size = sum(f.stat().st_size for f in files)
    if size > MAX_GGUF_BYTES:
        return StageResult.skip(STAGE, NAME, f"GGUF of {size / 1024**3:.1f} GiB: a CPU run of vLLM's model and "
                                f"drafter needs one of at most {MAX_GGUF_BYTES / 1024**3:.0f} GiB")
    gguf = files[0]
    if model is None:
        model = VllmCpuModel(gguf, hf_dir, backend, max_model_len=max(256, length + num_speculative_tokens + 8),
                             speculative_config={"method": "mtp", "num_speculative_tokens": num_speculative_tokens})
    ref = GlmDsaReference(gguf)
    tokens = prompt_tokens(length, seed, ref.n_vocab)
    run = model.draft(tokens)
    shifted = [*tokens[1:], run.next_token]
    attention: Attention = "dense" if backend == "TRITON_MLA" else "sparse-fp8"
    steps = ref.draft_chain(shifted, run.target_hidden, run.inputs[1:], attention=attention)
    reports = compare_chain(run.logits, run.carried, run.inputs, [s.logits[-1] for s in steps],
                            [s.out[-1] for s in steps])
    return verdict(reports, f"cpu: vLLM {backend} MTP drafter, {num_speculative_tokens} tokens after "
                            f"{length} prompt tokens")
