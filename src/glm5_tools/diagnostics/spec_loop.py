"""vLLM's speculative-decoding loop with the MTP drafter, for one greedy request, on the CPU.

``vllm serve ... --speculative-config '{"method": "mtp", "num_speculative_tokens": N}'``
runs, in its model runner (GPUModelRunner, CUDA only), a loop of engine steps:

1. the target's forward over the scheduled tokens (the prompt; later the last sampled
   token and the N drafts the previous step proposed, one "decode" of 1 + N tokens);
2. sampling: vLLM's ``Sampler`` after a prefill; after a step with drafts the
   ``RejectionSampler`` over the spec-decode metadata the runner computes
   (``GPUModelRunner._calc_spec_decode_metadata``): greedy, each draft is accepted while
   it equals the target's argmax, then the target's own token (recovered, or the bonus
   token after N accepted drafts);
3. the proposer (``EagleProposer``, which vLLM builds for method ``mtp``): after a step
   with drafts ``prepare_next_token_ids_padded`` and ``prepare_inputs_padded`` (the last
   accepted token, rejected drafts as padding), then ``propose``: its first-pass input
   setup (``set_inputs_first_pass``: the target's token ids shifted by one, the next
   token last, the target's hidden states), the drafter's forward, and N - 1 chained
   steps (``eagle_step_update_slot_mapping_and_metadata``, one token each, the previous
   step's hidden state).

``SpecLoop`` runs exactly these vLLM objects and functions, in this order, on the CPU:
the model (target and drafter) is ``vllm_forward.VllmCpuModel``'s (vLLM's model code and
backends, Triton kernels in Triton's interpreter, CPU stand-ins for CUDA-only ops), the
proposer is vLLM's ``EagleProposer`` with its attention groups made from vLLM's own KV
cache grouping (``get_kv_cache_groups``), the spec-decode Triton kernels run in the
interpreter. What it does not run is GPUModelRunner itself (it allocates on CUDA): the
loop keeps, for its one request, the runner's bookkeeping (the token list, the number of
computed tokens, the block table, the batch's CommonAttentionMetadata, the scheduled
token ids it indexes the drafts from) and calls the runner's
``_calc_spec_decode_metadata`` on that state. The same loop with ``speculative=False``
is greedy decoding without MTP: one target token per step, vLLM's ``Sampler``.

Counts per draft position come from vLLM's ``SpecDecodingStats`` as the scheduler feeds
it (accepted = sampled tokens - 1). See docs/diagnostics.md, "vLLM's MTP loop".
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from glm5_tools.diagnostics.patching import replaced
from glm5_tools.diagnostics.vllm_forward import BLOCK, VllmCpuModel, cpu_standins

REQ = "request-0"
# The drafter's logits of the loop's first proposal against the chain VllmCpuModel.draft runs
# on the same inputs (vLLM's model code both, float32): measured equal bit for bit.
FIRST_PROPOSAL_TOL = 1e-5
_PREFILLS: weakref.WeakKeyDictionary[VllmCpuModel, dict[tuple[int, ...], Any]] = weakref.WeakKeyDictionary()


@dataclass
class Step:
    """One engine step: the tokens it scheduled (the last sampled token first, then the
    drafts it verifies), how many were drafts, what it sampled (accepted drafts, then the
    target's own token) and the drafts it proposed for the next step."""

    scheduled: list[int]
    num_drafts: int
    sampled: list[int]
    proposed: list[int] = field(default_factory=list)


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]  # generated, in order (may run past max_new by the last step's tokens)
    steps: list[Step]
    accepted_per_position: list[int]  # SpecDecodingStats.num_accepted_tokens_per_pos
    num_drafts: int  # proposals verified
    first_proposal_logits: list[torch.Tensor]  # the drafter's logits [V] at each step of the first proposal
    prompt_logits: torch.Tensor  # the target's logits [T, V] at every prompt position (its prefill)

    @property
    def acceptance(self) -> list[float]:
        """Per draft position: the fraction of verified proposals whose draft there was accepted."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]


def _module(name: str) -> Any:
    """The module as imported now (a fault test may have put a patched copy in its place)."""
    __import__(name)
    return sys.modules[name]


def standin_is_pin_memory_available() -> bool:
    """Stand-in for vLLM's check of pinned host memory, which asks CUDA: none without a
    GPU driver (the proposer's host buffers are then ordinary memory)."""
    return False


def greedy_sampling_metadata(tokens: list[int], vocab: int) -> Any:
    """vLLM's SamplingMetadata of one greedy request (temperature 0, no penalties)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(1)
    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros,
        presence_penalties=zeros, repetition_penalties=torch.ones(1), output_token_ids=[list(tokens)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )


class SpecLoop:
    """One greedy request through vLLM's MTP loop on a VllmCpuModel built with a
    speculative config (``VllmCpuModel(..., speculative_config={"method": "mtp", ...})``).
    The vLLM modules are looked up when the loop is made, so a fault test can put patched
    copies of them in place first."""

    def __init__(self, model: VllmCpuModel) -> None:
        if model.drafter is None:
            raise ValueError("SpecLoop: the model was built without a speculative_config")
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        self.model = model
        self.vllm_config = model.vllm_config
        self.num_spec = int(self.vllm_config.speculative_config.num_speculative_tokens)
        self.vocab = int(model.model_config.hf_config.vocab_size)
        eagle = _module("vllm.v1.spec_decode.eagle")
        rejection = _module("vllm.v1.sample.rejection_sampler")
        self.sampler = Sampler()
        self.rejection_sampler = rejection.RejectionSampler(self.sampler)
        self._calc_spec_decode_metadata = GPUModelRunner._calc_spec_decode_metadata
        self._cumsum_and_arange = GPUModelRunner._get_cumsum_and_arange
        cpu = torch.device("cpu")
        base = _module("vllm.v1.spec_decode.llm_base_proposer")
        with torch.no_grad(), set_current_vllm_config(self.vllm_config), cpu_standins(), \
                replaced(base, is_pin_memory_available=standin_is_pin_memory_available):
            # what GPUModelRunner builds for method "mtp", and how load_model wires it to the
            # drafter it loaded (VllmCpuModel loaded it as LLMBaseProposer._get_model does)
            self.proposer = eagle.EagleProposer(self.vllm_config, cpu)
            self.proposer.model = model.drafter
            drafter_modules = {id(m) for m in model.drafter.modules()}
            self.proposer._draft_attn_layer_names = {
                name for name, layer in model._attn_layers.items() if id(layer) in drafter_modules}
            self.proposer.initialize_cudagraph_keys(CUDAGraphMode.NONE)
            specs = {name: model.specs[name] for name in model._attn_layers}
            groups = get_kv_cache_groups(self.vllm_config, specs)
            page = sum(g.kv_cache_spec.page_size_bytes for g in groups)
            kv_config = get_kv_cache_config_from_groups(self.vllm_config, groups, page * model.num_blocks)
            self.proposer.initialize_attn_backend(kv_config)
        # the target's prefill of a prompt, shared by every loop on this model
        self._prefills = _PREFILLS.setdefault(model, {})
        if self.proposer.block_size != BLOCK:
            raise ValueError(f"SpecLoop: the drafter's block size {self.proposer.block_size}, the caches' {BLOCK}")

    # --- the runner's per-step state ----------------------------------------------------

    def _cm(self, start: int, end: int, block_table: torch.Tensor) -> Any:
        """CommonAttentionMetadata of one request scheduling positions start..end-1."""
        pos = torch.arange(start, end)
        slots = (block_table[0, pos // BLOCK].long() * BLOCK + pos % BLOCK).to(torch.int64)
        return self.model.common_metadata([end - start], [end], block_table, slots)

    def _runner(self, scheduled: list[int]) -> Any:
        """What _calc_spec_decode_metadata reads of GPUModelRunner: its scratch aranges and
        the step's scheduled token ids (input_ids)."""
        runner = SimpleNamespace(device=torch.device("cpu"), arange_np=np.arange(4096),
                                 _arange_scratch=np.zeros(4096, dtype=np.int64),
                                 input_ids=SimpleNamespace(gpu=torch.tensor(scheduled, dtype=torch.int32)))
        runner._get_cumsum_and_arange = lambda *a, **k: self._cumsum_and_arange(runner, *a, **k)
        return runner

    def _batch(self, tokens: list[int]) -> tuple[Any, dict[str, Any]]:
        """The runner's InputBatch and request states, as prepare_next_token_ids_padded reads
        them (the request's tokens so far, without drafts)."""
        batch = SimpleNamespace(num_reqs=1, req_ids=[REQ], vocab_size=self.vocab,
                                num_tokens_no_spec=np.array([len(tokens)]))
        return batch, {REQ: SimpleNamespace(get_token_id=lambda i: tokens[i])}

    # --- the loop -----------------------------------------------------------------------

    def _prefill(self, prompt: list[int], block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The target's prefill of the prompt (the caches, its hidden states [T, d] and its
        logits at every position [T, V]) and the step's CommonAttentionMetadata. Computed
        once per prompt: later runs restore the target's caches as the prefill left them
        (the drafter's caches start empty each run)."""
        m, t0 = self.model, len(prompt)
        m.reset_caches()
        key = tuple(prompt)
        target = [name for name in m._attn_layers if name not in self.proposer._draft_attn_layer_names]
        if key not in self._prefills:
            cm = self._cm(0, t0, block_table)
            hidden = m.run(m.model, cm, torch.tensor(prompt, dtype=torch.long), torch.arange(t0),
                           intermediate_tensors=None)
            caches = {name: m._attn_layers[name].kv_cache.clone() for name in target}
            self._prefills.clear()
            self._prefills[key] = (caches, hidden, m.logits(m.model, hidden))
        caches, hidden, logits = self._prefills[key]
        for name in target:
            m._attn_layers[name].kv_cache.copy_(caches[name])
        return hidden, logits, self._cm(0, t0, block_table)

    def generate(self, prompt: list[int], max_new: int, *, speculative: bool = True) -> Generation:
        """Greedy generation of at least max_new tokens after prompt, with the MTP drafter
        (speculative) or the target alone."""
        from vllm.config import set_current_vllm_config
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        m, t0 = self.model, len(prompt)
        block_table = m.block_table(m.num_blocks - 1)
        if t0 + max_new + self.num_spec + 1 > block_table.shape[1] * BLOCK:
            raise ValueError(f"SpecLoop: {t0} + {max_new} tokens past the model's {m.num_blocks - 1} blocks")
        tokens = list(prompt)
        stats = SpecDecodingStats.new(self.num_spec)
        steps: list[Step] = []
        first_logits: list[torch.Tensor] = []
        scheduled, num_drafts, computed = list(prompt), 0, 0
        drafts: list[int] = []
        with torch.no_grad(), set_current_vllm_config(self.vllm_config):
            while len(tokens) - t0 < max_new:
                end = computed + len(scheduled)
                positions = torch.arange(computed, end, dtype=torch.long)
                sm = greedy_sampling_metadata(tokens, self.vocab)
                spec_meta = None
                if computed == 0:
                    hidden, prompt_logits, cm = self._prefill(prompt, block_table)
                    sampled_ids = self.sampler(prompt_logits[-1:].clone(), sm).sampled_token_ids
                else:
                    cm = self._cm(computed, end, block_table)
                    hidden = m.run(m.model, cm, torch.tensor(scheduled, dtype=torch.long), positions,
                                   intermediate_tensors=None)
                    if num_drafts:
                        spec_meta = self._calc_spec_decode_metadata(
                            self._runner(scheduled), np.array([num_drafts], dtype=np.int32),
                            np.array([len(scheduled)], dtype=np.int32))
                        logits = m.logits(m.model, hidden[spec_meta.logits_indices])
                        sampled_ids = self.rejection_sampler(spec_meta, None, logits, sm).sampled_token_ids
                    else:
                        sampled_ids = self.sampler(m.logits(m.model, hidden[-1:]), sm).sampled_token_ids
                sampled = [int(x) for x in sampled_ids[0].tolist() if x >= 0]
                step = Step(scheduled=list(scheduled), num_drafts=num_drafts, sampled=sampled)
                steps.append(step)
                if num_drafts:
                    # the scheduler's count: every sampled token but the last is an accepted draft
                    stats.observe_draft(num_draft_tokens=num_drafts, num_accepted_tokens=len(sampled) - 1)
                tokens += sampled
                drafts = []
                if speculative and len(tokens) - t0 < max_new:  # no proposal after the last step
                    drafts = self._propose(cm, spec_meta, sampled_ids, scheduled, positions, hidden, tokens, sm,
                                           first_logits if not first_logits else None)
                    step.proposed = list(drafts)
                computed = len(tokens) - 1  # every token but the last sampled one is in the caches
                scheduled, num_drafts = [tokens[-1], *drafts], len(drafts)
        return Generation(prompt=list(prompt), tokens=tokens[t0:], steps=steps,
                          accepted_per_position=list(stats.num_accepted_tokens_per_pos), num_drafts=stats.num_drafts,
                          first_proposal_logits=first_logits, prompt_logits=self._prefills[tuple(prompt)][2])

    def _propose(self, cm: Any, spec_meta: Any, sampled_ids: torch.Tensor, scheduled: list[int],
                 positions: torch.Tensor, hidden: torch.Tensor, tokens: list[int], sm: Any,
                 record: list[torch.Tensor] | None) -> list[int]:
        """GPUModelRunner.propose_draft_token_ids for method mtp with the padded drafter
        batch (vLLM's default), then EagleProposer.propose."""
        p = self.proposer
        batch, requests = self._batch(tokens)
        with cpu_standins():
            next_ids, valid = p.prepare_next_token_ids_padded(sampled_ids, requests, batch,
                                                              torch.zeros(1, dtype=torch.bool))
            num_rejected = indices = None
            n = len(scheduled)
            if spec_meta is not None:
                cm, indices, num_rejected = p.prepare_inputs_padded(cm, spec_meta, valid)
                n = int(cm.num_actual_tokens)
            drafter = p.model
            own = "compute_logits" in vars(drafter)  # a test's wrapper, kept
            real = drafter.compute_logits

            def logged(h: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
                out: torch.Tensor = real(h, *a, **k)
                if record is not None:
                    record.append(out[0, : self.vocab].float().clone())
                return out

            drafter.compute_logits = logged
            try:
                out = p.propose(
                    target_token_ids=torch.tensor(scheduled[:n], dtype=torch.int32),
                    target_positions=positions[:n], target_hidden_states=hidden[:n], next_token_ids=next_ids,
                    token_indices_to_sample=indices, common_attn_metadata=cm, sampling_metadata=sm,
                    num_rejected_tokens_gpu=num_rejected, slot_mappings=None)
            finally:
                if own:
                    drafter.compute_logits = real
                else:
                    del drafter.compute_logits
        return [int(x) for x in out[0].tolist()]


def check(gen: Generation, greedy: Generation, *, expected_acceptance: Sequence[float],
          reference: Sequence[torch.Tensor] | None = None) -> list[str]:
    """What a loop run did wrong, in the loop's order (none: an empty list):

    * the first proposal's drafter logits at each draft step against ``reference`` (the
      chain ``VllmCpuModel.draft`` runs on the same prompt: its own token shift and
      hidden states, no proposer), relative L2 error within FIRST_PROPOSAL_TOL: step 0
      checks the proposer's first-pass input setup, steps 1+ its chained steps;
    * the tokens generated with MTP against ``greedy`` (the same loop without MTP): greedy
      speculative decoding must give exactly the target's greedy output, whatever the
      drafts (the verification and the rejection sampler);
    * the acceptance at each draft position (vLLM's SpecDecodingStats) against
      ``expected_acceptance`` (on the MTP chain fixture: a correct drafter 1.0 everywhere)."""
    problems = []
    if reference is not None:
        if len(gen.first_proposal_logits) != len(reference):
            problems.append(f"first proposal: {len(gen.first_proposal_logits)} draft steps, the reference "
                            f"chain {len(reference)}")
        for k, (got, want) in enumerate(zip(gen.first_proposal_logits, reference, strict=False)):
            rel = float((got - want).norm() / want.norm().clamp(min=1e-30))
            if not rel <= FIRST_PROPOSAL_TOL:
                problems.append(f"first proposal, draft step {k}: the drafter's logits differ from the chain run "
                                f"on the same inputs without the proposer (rel {rel:.2e}, tolerance "
                                f"{FIRST_PROPOSAL_TOL:g}; argmax {int(got.argmax())} vs {int(want.argmax())})")
    n = min(len(gen.tokens), len(greedy.tokens))
    diff = next((i for i in range(n) if gen.tokens[i] != greedy.tokens[i]), None)
    if diff is not None:
        at, step = 0, gen.steps[0]
        for step in gen.steps:
            if at + len(step.sampled) > diff:
                break
            at += len(step.sampled)
        problems.append(f"generated token {diff}: {gen.tokens[diff]} with MTP, {greedy.tokens[diff]} by greedy "
                        f"decoding without MTP (the step that verified drafts {step.scheduled[1:]} sampled "
                        f"{step.sampled})")
    for i, want_rate in enumerate(expected_acceptance):
        rate = gen.acceptance[i] if i < len(gen.acceptance) else 0.0
        if rate != want_rate:
            got_n = gen.accepted_per_position[i] if i < len(gen.accepted_per_position) else 0
            problems.append(f"acceptance at draft position {i}: {got_n} of {gen.num_drafts} proposals "
                            f"({rate:.2f}), expected {want_rate:.2f}")
    return problems
