"""The funnel on the team's llama.cpp-converted and -quantized tiny GLM-5 (when built).

Real names (safetensors headers) against a real llama.cpp GGUF: every CPU stage passes,
at TP 1 and at the deployed TP 8, a mis-sharded kv_b_proj on the real attn_k_b/attn_v_b
is caught by stage 3, and stage 4 refuses a tensor-parallel size whose row splits fall
inside quantization blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glm5_tools.diagnostics import stage_dequant, stage_layers, stage_mapping, stage_sharding, torch_dequant
from glm5_tools.diagnostics.gguf_io import read_tensors
from glm5_tools.diagnostics.result import Verdict

FIXTURE = Path(__file__).resolve().parents[3] / ".cache" / "fixtures" / "tiny-glm5"
GGUF = FIXTURE / "gguf" / "tiny-glm5-UD-Q4_K_XL.gguf"
pytestmark = pytest.mark.skipif(not GGUF.exists(),
                                reason="tiny GLM-5 fixture not built (scripts/make-tiny-glm5)")


@pytest.fixture(scope="module")
def fixture_model():
    cfg = json.loads((FIXTURE / "hf" / "config.json").read_text())
    tensors, meta = read_tensors(GGUF)
    return cfg, tensors, meta


def test_cpu_stages_pass_on_llama_cpp_gguf(fixture_model):
    cfg, tensors, meta = fixture_model
    params = stage_mapping.hf_params_from_safetensors(FIXTURE / "hf")
    assert params
    r1 = stage_dequant.run_stage(tensors, stage_dequant.torch_cpu_dequantizer, "cpu",
                                 supports=torch_dequant.supported)
    r2 = stage_mapping.run_stage(params, tensors, cfg, str(meta["general.architecture"]))
    r3 = stage_sharding.run_stage(tensors, cfg, 8, layers=[0, 1])
    r4 = stage_layers.run_stage(tensors, cfg, 1)
    assert [r.verdict for r in (r1, r2, r3, r4)] == [Verdict.PASS] * 4, (r1, r2, r3, r4)
    assert r4.measured is not None and r4.measured < 1e-6


def test_layers_refuse_tp_splitting_inside_blocks(fixture_model):
    """At TP 16 the dense down projection's 2048 inputs are 128 per rank, half a Q6_K
    block: vLLM's GGUF loader would cut rows inside it, and the stage says so."""
    cfg, tensors, _ = fixture_model
    r4 = stage_layers.run_stage(tensors, cfg, 16, layers=[0])
    assert r4.verdict is Verdict.FAIL
    assert any("down_proj" in d and "inside Q6_K's 256-value blocks" in d for d in r4.details), r4.details


def test_tp8_funnel_passes_on_the_fixture(fixture_model, tmp_path: Path):
    """The command docs/validation/diagnostics.md records, at TP 8 on the CPU (with
    the old fixture, whose down projections split inside K-quant blocks at
    TP 8, stage 4 failed). Stages 1-5 must pass, stage 4 over every rank of the first
    dense, first MoE and last layer, including the merged layers with a BF16 shard
    beside a quantized one (patch 0010)."""
    from glm5_tools.diagnostics import cli

    cfg, _, _ = fixture_model
    report = tmp_path / "tp8.json"
    rc = cli.main(["--gguf", str(GGUF), "--hf-config", str(FIXTURE / "hf"), "--tp", "8",
                   "--device", "cpu", "--stages", "1,2,3,4,5", "--json", str(report)])
    data = json.loads(report.read_text())
    stages = {s["stage"]: s for s in data["stages"]}
    assert rc == 0 and sorted(stages) == [1, 2, 3, 4, 5], data
    assert all(s["verdict"] == "pass" for s in stages.values()), data
    layers = stages[4]["details"]
    assert any("gate_up_proj" in d and "BF16+" in d and "8 rank(s)" in d for d in layers), layers
    assert any("fused_qkv_a_proj" in d and "BF16" in d for d in layers), layers
    assert any(f"blk.{cfg['first_k_dense_replace']} shared_experts.down_proj" in d and "8 rank(s)" in d
               for d in layers), layers


def test_mis_sharded_kv_b_on_real_k_b_v_b(fixture_model):
    cfg, tensors, _ = fixture_model

    def wrong(k_b, v_b):
        lora = k_b.shape[1]
        return torch.cat([k_b.transpose(1, 2).reshape(-1, lora), v_b.reshape(-1, lora)])

    r3 = stage_sharding.run_stage(tensors, cfg, 8, kv_b_builder=wrong, layers=[1])
    assert r3.verdict is Verdict.FAIL
