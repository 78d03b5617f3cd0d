"""Patch 0011: the Triton indexer's per-step token metadata, built by vLLM's own
DeepseekV32IndexerMetadataBuilder, holds for every token of the step its request,
its context length and the batch's whole block table — for decode-only, mixed
and prefill steps.

The builder's decode branch rebinds its local ``seq_lens`` to a ``(B, 1)`` view
and ``block_table`` to the decode rows only; a builder that handed those to the
Triton indexer failed on every step with a decode token (found by the sm_120
trace, docs/validation/sm120.md). This test checks the values, not only that the
build runs, also for MTP verification steps (a builder configured with 3 draft
tokens, requests of 1 + 3 query tokens): a token that saw the drafts after it
would still give a plausible served output on the random fixture (GPU run 8,
docs/validation/e2e_serving.md), so this is where that fault is caught.
It runs in a subprocess: the builder needs a CUDA platform, and the virtual one
(glm5_tools.sm_check) changes the process for good.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import warm

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import vllm._custom_ops  # noqa: F401  (op registrations on the no-device platform)
    from glm5_tools.sm_check import glm5
    from glm5_tools.sm_check.targets import target
    from glm5_tools.sm_check.trace import install_vllm_platform, virtual_device

    sm120 = target("sm_120")
    install_vllm_platform(sm120)
    import torch
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from types import SimpleNamespace

    config = glm5._config(AttentionBackendEnum.TRITON_MLA_SPARSE)
    spec = SimpleNamespace(block_size=glm5.PAGE, storage_block_size=glm5.PAGE, num_kv_heads=1,
                           head_size=glm5.KV_LORA + glm5.ROPE)
    # MTP with 3 draft tokens: the builder's decode threshold becomes 4, so a
    # verification step's requests (1 + 3 query tokens each) are decodes
    spec_config = glm5._config(AttentionBackendEnum.TRITON_MLA_SPARSE)
    spec_config.speculative_config = SimpleNamespace(num_speculative_tokens=3)
    out = {}
    with virtual_device(sm120):
        builders = {
            cfg_name: DeepseekV32IndexerMetadataBuilder(
                spec, ["model.layers.0.self_attn.indexer.k_cache"], cfg, torch.device("cpu"))
            for cfg_name, cfg in (("plain", config), ("mtp3", spec_config))
        }
        batches = [
            ("plain", glm5.Batch("decode x1", ((1, 4096),))),
            ("plain", glm5.Batch("decode x3", ((1, 3000), (1, 17), (1, 9000)))),
            ("plain", glm5.Batch("mixed", ((1, 2500), (1, 70), (512, 2012), (3, 3)))),
            ("plain", glm5.Batch("prefill", ((100, 100),))),
            ("mtp3", glm5.Batch("verify x3", ((4, 3000), (4, 17), (4, 9000)))),
            ("mtp3", glm5.Batch("verify uneven + prefill", ((4, 2500), (2, 70), (512, 2012)))),
        ]
        for cfg_name, batch in batches:
            builder = builders[cfg_name]
            common = glm5._common(batch)
            # every request its own block rows, so a wrong row shows
            common.block_table_tensor += 1000 * torch.arange(
                len(batch.requests), dtype=torch.int32)[:, None]
            # as wide as the runner's block table (max_model_len's blocks): the
            # builder's MTP decode path copies whole rows into its own buffer
            width = builder.expanded_block_table_buffer.shape[1]
            common.block_table_tensor = torch.nn.functional.pad(
                common.block_table_tensor, (0, width - common.block_table_tensor.shape[1]))
            meta = builder.build(0, common)
            tok = meta.triton_tokens
            out[batch.name] = {
                "req": tok.token_req.tolist(),
                "ctx": tok.token_ctx.tolist(),
                "table_first": tok.block_table[:, 0].tolist(),
                "decodes": int(meta.num_decodes),
            }
    print("RESULT " + json.dumps(out))
    """
)

BATCHES = {
    "decode x1": ((1, 4096),),
    "decode x3": ((1, 3000), (1, 17), (1, 9000)),
    "mixed": ((1, 2500), (1, 70), (512, 2012), (3, 3)),
    "prefill": ((100, 100),),
    # MTP verification steps: every query token sees the context up to itself, not
    # the draft tokens after it in its own request
    "verify x3": ((4, 3000), (4, 17), (4, 9000)),
    "verify uneven + prefill": ((4, 2500), (2, 70), (512, 2012)),
}


def expected(requests: tuple[tuple[int, int], ...]) -> tuple[list[int], list[int]]:
    req: list[int] = []
    ctx: list[int] = []
    for r, (q, s) in enumerate(requests):
        for j in range(q):
            req.append(r)
            ctx.append(s - q + j + 1)
    return req, ctx


def test_builder_token_metadata_per_step() -> None:
    import conftest

    # the builder's own Triton kernels (prefill chunk metadata) run in Triton's interpreter
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(conftest.PATCHED_SITE), str(ROOT / "src")])
    proc = warm.run([sys.executable, "-c", SCRIPT], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    assert got["decode x3"]["decodes"] == 3, "the decode branch of the builder was not taken"
    assert got["mixed"]["decodes"] == 2, "the mixed step has two decodes"
    assert got["verify x3"]["decodes"] == 3, "with 3 draft tokens, 4-token requests are decodes"
    assert got["verify uneven + prefill"]["decodes"] == 2, "two verification requests, one prefill"
    for name, requests in BATCHES.items():
        req, ctx = expected(requests)
        assert got[name]["req"] == req, name
        assert got[name]["ctx"] == ctx, name
        # the batch's whole block table (one row per request), not the decode rows only
        assert got[name]["table_first"] == [1000 * r for r in range(len(requests))], name
