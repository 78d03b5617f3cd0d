"""Patch 0006: GGUF MoE layers with unquantized (F32/F16/BF16) experts.

vLLM 0.20.2 gives every MoE layer of a GGUF model the GGUF MoE method, whose
parameters are qweights; a BF16 GGUF of GLM-5 then stopped at load with
KeyError 'model.layers.1.mlp.experts.w2_weight' (GPU run 3,
docs/validation/e2e_serving.md). With 0006 such a layer gets the unquantized MoE
method and the iterators hand it the merged experts one expert at a time.

CI has no GPU: the method's constructor picks a kernel backend by platform, so
these tests present vLLM's platform as the CPU one (the only thing faked here).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import overlay
import pytest
import roundtrip
import torch
from torch.nn.parameter import UninitializedParameter

PREFIX = "model.layers.1.mlp.experts"
N_EXPERTS, HIDDEN, INTER = 8, 64, 32
ALL_UNQUANTIZED = [f"{PREFIX}.0.{p}_proj" for p in ("gate", "up", "down")]


def build(unquantized: list[str]) -> dict[str, object]:
    """The MoE method GGUFConfig picks for PREFIX, and the parameters it creates."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE
    from vllm.model_executor.layers.quantization.gguf import GGUFConfig
    from vllm.platforms import current_platform

    class Layer(FusedMoE):
        """A FusedMoE as get_quant_method and create_weights see it (its config only)."""

        def __init__(self, config: object) -> None:
            torch.nn.Module.__init__(self)
            self.moe_config = config

    parallel = FusedMoEParallelConfig(
        tp_size=1,
        pcp_size=1,
        dp_size=1,
        ep_size=1,
        tp_rank=0,
        pcp_rank=0,
        dp_rank=0,
        ep_rank=0,
        sp_size=1,
        use_ep=False,
        all2all_backend="naive",
        enable_eplb=False,
    )
    config = FusedMoEConfig(
        num_experts=N_EXPERTS,
        experts_per_token=2,
        hidden_dim=HIDDEN,
        intermediate_size_per_partition=INTER,
        num_local_experts=N_EXPERTS,
        num_logical_experts=N_EXPERTS,
        activation=MoEActivation.SILU,
        device="cpu",
        routing_method=RoutingMethodType.DeepSeekV3,
        moe_parallel_config=parallel,
        in_dtype=torch.bfloat16,
    )
    platform = type(current_platform)
    saved = platform.is_cpu
    platform.is_cpu = lambda self: True  # type: ignore[method-assign]
    try:
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            layer = Layer(config)
            method = GGUFConfig(unquantized_modules=unquantized).get_quant_method(layer, PREFIX)
            assert method is not None
            method.create_weights(
                layer,
                num_experts=N_EXPERTS,
                hidden_size=HIDDEN,
                intermediate_size_per_partition=INTER,
                params_dtype=torch.bfloat16,
                weight_loader=None,
            )
    finally:
        platform.is_cpu = saved  # type: ignore[method-assign]
    params = {n: None if isinstance(p, UninitializedParameter) else list(p.shape) for n, p in layer.named_parameters()}
    return {"method": type(method).__name__, "params": params}


def test_unquantized_experts_get_unquantized_method() -> None:
    got = build(ALL_UNQUANTIZED)
    assert got["method"] == "UnquantizedFusedMoEMethod"
    # the names deepseek_v2's expert mapping loads into (the KeyError of run 3)
    assert got["params"] == {"w13_weight": [N_EXPERTS, 2 * INTER, HIDDEN], "w2_weight": [N_EXPERTS, HIDDEN, INTER]}


def test_quantized_experts_keep_gguf_method() -> None:
    got = build([])
    assert got["method"] == "GGUFMoEMethod"
    assert "w2_qweight" in got["params"] and "w2_weight" not in got["params"]


def test_mixed_experts_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=rf"{PREFIX} mix quantized and unquantized"):
        build(ALL_UNQUANTIZED[:2])


def test_without_0006_unquantized_experts_have_no_w2_weight(tmp_path) -> None:
    site = overlay.make_overlay(tmp_path / "site", [p for p in overlay.patches() if not p.name.startswith("0006-")])
    code = (
        "import json, sys, test_unquantized_experts as t\n"
        "print('GLM5-REPORT ' + json.dumps(t.build(json.loads(sys.argv[1]))))\n"
    )
    proc = overlay.run_in(site, code, json.dumps(ALL_UNQUANTIZED))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("GLM5-REPORT ")]
    assert lines, proc.stderr[-3000:]
    got = json.loads(lines[0].removeprefix("GLM5-REPORT "))
    assert got["method"] == "GGUFMoEMethod" and "w2_qweight" in got["params"] and "w2_weight" not in got["params"]


@pytest.mark.skipif(not roundtrip.BF16_GGUF.is_file(), reason="tiny fixture missing: run scripts/make-tiny-glm5")
@pytest.mark.parametrize("gguf_name", ["bf16", "q4"])
def test_iterator_splits_only_unquantized_experts(gguf_name: str) -> None:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import weight_utils
    from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader
    from vllm.transformers_utils.config import get_config

    config = get_config(str(roundtrip.HF_DIR), trust_remote_code=False)
    loader = GGUFModelLoader(LoadConfig(load_format="gguf"))
    name_map = loader._get_gguf_weights_map(SimpleNamespace(hf_config=config, trust_remote_code=False))
    path = roundtrip.BF16_GGUF if gguf_name == "bf16" else roundtrip.QUANT_GGUF
    experts = {n: t for n, t in weight_utils.gguf_quant_weights_iterator(str(path), name_map) if ".mlp.experts." in n}
    layer = f"model.layers.{config.first_k_dense_replace}.mlp.experts"
    if gguf_name == "bf16":
        for e in range(config.n_routed_experts):
            assert experts[f"{layer}.{e}.down_proj.weight"].shape == (config.hidden_size, config.moe_intermediate_size)
            assert experts[f"{layer}.{e}.gate_proj.weight"].shape == (config.moe_intermediate_size, config.hidden_size)
    else:
        assert not [n for n in experts if f"{layer}.1." in n]
        assert experts[f"{layer}.0.down_proj.qweight"].dim() == 3


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(build(json.loads(sys.argv[1]))))
