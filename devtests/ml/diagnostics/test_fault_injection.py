"""Fault injection on a tiny synthetic glm-dsa GGUF: the funnel names the stage at fault.

CPU only (CI): stage 1 runs the independent torch dequantizer, stage 2 the loader's name
map, stage 3 vLLM's real linear weight loaders, stage 4 vLLM's GGUF layers and FusedMoE
(patched, as deployed; gguf-py in place of the kernels; 16 routed experts, past the
"10" before "2" of a string sort), stage 5 the absorbed-vs-expanded
PyTorch MLA. The GPU variants (vLLM's kernels) are recorded in docs/validation/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glm5_tools.diagnostics import (
    stage_attention,
    stage_dequant,
    stage_layers,
    stage_mapping,
    stage_sharding,
    torch_dequant,
)
from glm5_tools.diagnostics.dims import MLADims
from glm5_tools.diagnostics.gguf_io import read_tensors
from glm5_tools.diagnostics.result import StageResult, Verdict, render_table
from glm5_tools.diagnostics.synthetic import write_gguf

TP = 2
CFG = {
    "model_type": "glm_moe_dsa",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "q_lora_rank": 256,
    "kv_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "index_n_heads": 2,
    "index_head_dim": 64,
    "index_topk": 16,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "vocab_size": 256,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(CFG))
    path = write_gguf(CFG, d / "tiny-glm-dsa.gguf")
    tensors, meta = read_tensors(path)
    return tensors, meta


def funnel(model, dequantizer=None, mapper=None, kv_b_builder=None, scale=None):
    tensors, meta = model
    arch = str(meta["general.architecture"])
    return [
        stage_dequant.run_stage(tensors, dequantizer or stage_dequant.torch_cpu_dequantizer,
                                "cpu", supports=torch_dequant.supported),
        stage_mapping.run_stage(stage_mapping.hf_params_from_config(CFG), tensors, CFG, arch,
                                mapper=mapper),
        stage_sharding.run_stage(tensors, CFG, TP,
                                 kv_b_builder=kv_b_builder or stage_sharding.rebuild_kv_b),
        stage_layers.run_stage(tensors, CFG, TP),
        stage_attention.run_stage(MLADims.from_config(CFG).per_rank(TP), "cpu",
                                  scale_under_test=scale),
    ]


def failing(results: list[StageResult]) -> list[int]:
    print(render_table(results))
    return [r.stage for r in results if r.verdict is Verdict.FAIL]


def test_clean_model_passes_every_stage(model):
    results = funnel(model)
    assert failing(results) == []
    assert all(r.verdict is Verdict.PASS for r in results)


def test_corrupted_dequantization_is_stage_1(model):
    def corrupted(raw, qtype, m, n):
        out = stage_dequant.torch_cpu_dequantizer(raw, qtype, m, n).clone()
        out[:, ::32] *= -1  # one value in every 32 sign-flipped (a wrong scale bit)
        return out

    assert failing(funnel(model, dequantizer=corrupted)) == [1]


def test_dropped_mapping_is_stage_2(model):
    tensors, _ = model
    base = stage_mapping.loader_mapper("glm-dsa", 2, set(tensors))

    def dropped(hf):
        return [] if hf == "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" else base(hf)

    results = funnel(model, mapper=dropped)
    assert failing(results) == [2]
    assert any("unmapped" in d for d in results[1].details)
    assert any("unused" in d for d in results[1].details)


def test_swapped_mapping_is_stage_2(model):
    tensors, _ = model
    base = stage_mapping.loader_mapper("glm-dsa", 2, set(tensors))
    swap = {"model.layers.0.mlp.gate_proj.weight": "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.gate_proj.weight"}

    def swapped(hf):
        return base(swap.get(hf, hf))

    results = funnel(model, mapper=swapped)
    assert failing(results) == [2]
    assert any("round trip" in d for d in results[1].details)


def test_mis_sharded_kv_b_proj_is_stage_3(model):
    def all_k_then_all_v(k_b, v_b):
        # k blocks of every head, then v blocks of every head: a row split then hands
        # each rank the k of some heads and the v of others
        lora = k_b.shape[1]
        return torch.cat([k_b.transpose(1, 2).reshape(-1, lora), v_b.reshape(-1, lora)])

    results = funnel(model, kv_b_builder=all_k_then_all_v)
    assert failing(results) == [3]
    assert any("kv_b_proj" in d and "rank" in d for d in results[2].details)


FAULTS = Path(__file__).resolve().parent / "faults"


def stage_4_on_overlay(tmp_path: Path, applied: list[Path], layers: list[int] | None = None) -> dict:
    """Stage 4 on the module's synthetic model, in a fresh interpreter whose vLLM is an
    overlay with the given patches (a fault vLLM cannot have in this one)."""
    import overlay

    site = overlay.make_overlay(tmp_path / "site", applied)
    gguf_path = next(tmp_path.parent.glob("tiny*/tiny-glm-dsa.gguf"))
    code = (
        "import json, sys\n"
        "from glm5_tools.diagnostics import stage_layers\n"
        "from glm5_tools.diagnostics.gguf_io import read_tensors\n"
        "tensors, _ = read_tensors(__import__('pathlib').Path(sys.argv[1]))\n"
        "r = stage_layers.run_stage(tensors, json.loads(sys.argv[2]), int(sys.argv[3]),\n"
        "                           layers=json.loads(sys.argv[4]))\n"
        "print('GLM5-REPORT ' + json.dumps(r.to_dict()))\n"
    )
    env_path = str(Path(__file__).resolve().parents[3] / "src")
    proc = overlay.run_in(site, f"import sys; sys.path.insert(0, {env_path!r})\n" + code,
                          str(gguf_path), json.dumps(CFG), str(TP), json.dumps(layers))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("GLM5-REPORT ")]
    assert lines, proc.stderr[-3000:]
    report: dict = json.loads(lines[0].removeprefix("GLM5-REPORT "))
    print("\n".join(report["details"]))
    return report


def test_merged_shards_in_load_order_is_stage_4(model, tmp_path: Path):
    """vLLM without patch 0007: fused_qkv_a_proj's shards come out in the file's order
    ([kv_a, q_a]), the fault behind the garbage answers (docs/validation/e2e_serving.md).
    Run in a fresh interpreter on an overlay of vLLM lacking 0007."""
    import overlay

    report = stage_4_on_overlay(tmp_path, [p for p in overlay.patches() if not p.name.startswith("0007-")])
    assert report["verdict"] == "fail" and report["stage"] == 4
    bad = [d for d in report["details"] if " batch " in d and "rel err" in d]
    assert bad and all("fused_qkv_a_proj" in d for d in bad), report["details"]


def test_routed_experts_of_the_synthetic_model_pass_on_every_rank(model):
    """The routed-expert part of stage 4 runs, on every rank, with more than 10 experts
    (an ordering fault that sorts "10" before "2" needs them)."""
    tensors, _ = model
    assert CFG["n_routed_experts"] > 10
    result = stage_layers.run_stage(tensors, CFG, TP, layers=[1])
    assert result.verdict is Verdict.PASS, result.details
    line = next(d for d in result.details if "mlp.experts" in d)
    assert f"{CFG['n_routed_experts']} experts" in line and f"{TP} rank(s)" in line, line
    assert "weights max rel err 0.000e+00" in line, line


def test_experts_one_slot_off_is_stage_4(model, tmp_path: Path):
    """FusedMoE's weight loader putting every merged expert one slot on
    (faults/moe-experts-one-slot-off.patch) passed devtests/ml/patches, this suite and
    stages 1-5 before the routed-expert check; it fails stage 4 and names the slots."""
    import overlay

    report = stage_4_on_overlay(tmp_path, [*overlay.patches(), FAULTS / "moe-experts-one-slot-off.patch"],
                                layers=[1])
    assert report["verdict"] == "fail" and report["stage"] == 4
    details = report["details"]
    for rank in range(TP):
        assert f"blk.1 mlp.experts rank {rank}: w13 slot 1 holds expert 0" in details, details
        assert f"blk.1 mlp.experts rank {rank}: w2 slot 0 holds expert {CFG['n_routed_experts'] - 1}" in details
    assert any("mlp.experts" in d and "output rel err" in d for d in details), details
    linear = [d for d in details if " batch " in d and "rel err" in d]
    assert linear == [], linear


def test_experts_w1_w3_swapped_is_stage_4(model, tmp_path: Path):
    """FusedMoE's weight loader taking gate (w1) for up (w3) and back
    (faults/moe-w1-w3-swapped.patch): stage 4 fails on the routed experts."""
    import overlay

    report = stage_4_on_overlay(tmp_path, [*overlay.patches(), FAULTS / "moe-w1-w3-swapped.patch"],
                                layers=[1])
    assert report["verdict"] == "fail" and report["stage"] == 4
    details = report["details"]
    for rank in range(TP):
        assert f"blk.1 mlp.experts rank {rank}: w13: gate (w1) and up (w3) swapped in every expert" in details
    assert any("mlp.experts" in d and "output rel err" in d for d in details), details


def test_expert_slots_in_string_order_are_named(model):
    """Experts loaded in the order of their names as strings (0, 1, 10, 11, ..., 2): the
    check names the slot and the expert it holds (with 16 experts, slot 2 holds 10)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    from glm5_tools.diagnostics import stage_experts

    tensors, _ = model
    (spec,) = stage_experts.moe_specs(tensors, [1])
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        layer = stage_experts.build_layer(spec, 1, TP)
    err, problems = stage_experts.check_weights(layer, spec, 1, TP)
    assert err == 0.0 and problems == []
    string_order = sorted(range(spec.experts), key=str)
    for param in (layer.w13_qweight, layer.w2_qweight):
        param.data.copy_(param.data[string_order].clone())
    err, problems = stage_experts.check_weights(layer, spec, 1, TP)
    assert err > 0
    assert "w13 slot 2 holds expert 10" in problems and "w2 slot 2 holds expert 10" in problems, problems
    assert "w13 slot 1 holds expert 1" not in problems


def test_wrong_softmax_scale_is_stage_5(model):
    d = MLADims.from_config(CFG)
    wrong = (d.kv_lora_rank + d.qk_rope_head_dim) ** -0.5  # the latent-dim mistake
    assert failing(funnel(model, scale=wrong)) == [5]


def test_torch_dequantizer_matches_gguf_py_on_every_type(model):
    tensors, _ = model
    result = stage_dequant.run_stage(tensors, stage_dequant.torch_cpu_dequantizer, "cpu",
                                     per_type=10, supports=torch_dequant.supported)
    assert result.verdict is Verdict.PASS
    assert result.measured == 0.0
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0"} <= {t.type_name for t in tensors.values()}


def test_cli_writes_json_and_exit_status(model, tmp_path: Path):
    from glm5_tools.diagnostics.cli import main

    cfg = next(tmp_path.parent.glob("tiny*/config.json"))  # the module fixture's model
    out = tmp_path / "out.json"
    rc = main(["--gguf", str(cfg.parent / "tiny-glm-dsa.gguf"), "--hf-config", str(cfg),
               "--tp", str(TP), "--device", "cpu", "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and data["ok"] is True
    assert [s["verdict"] for s in data["stages"]] == ["pass", "pass", "pass", "pass", "pass", "skip"]
