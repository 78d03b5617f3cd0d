"""Patch 0010: a merged layer with a float (F32/F16/BF16) shard beside a quantized one.

The tiny fixture's UD-Q4_K_XL file holds two such layers (llama_cpp_tools overrides):
layer 0's mlp.gate_up_proj (ffn_gate BF16, ffn_up Q5_K) and layer 3's
self_attn.fused_qkv_a_proj (attn_kv_a_mqa BF16, attn_q_a Q5_K).

Failing test first: vLLM 0.20.2 with 0001-0009 lists the float shard
as an unquantized module, and is_layer_skipped_gguf then refuses the merged layer at
model construction ("Detected some but not all shards of ... are quantized"), so the
file cannot be served; these tests failed with that ValueError. With 0010 the loader
dequantizes the quantized shards of such a layer and builds it unquantized; the layer's
output, at TP 1 and 8, is x @ W^T with W the gguf-py dequantization of both shards.
"""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import roundtrip
import torch
import vllm.model_executor.layers.linear as linear
import vllm.model_executor.parameter as parameter
from vllm.model_executor.layers.quantization.gguf import GGUFConfig, is_layer_skipped_gguf
from vllm.model_executor.model_loader import weight_utils
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

pytestmark = pytest.mark.skipif(
    not roundtrip.QUANT_GGUF.is_file(), reason="tiny fixture missing: run scripts/make-tiny-glm5"
)

FLOAT = ("F32", "F16", "BF16")
# merged vLLM layer -> (its GGUF shards in shard order, their HF names)
MERGED = {
    "mlp.gate_up_proj": (("ffn_gate", "ffn_up"), ("mlp.gate_proj", "mlp.up_proj")),
    "self_attn.fused_qkv_a_proj": (
        ("attn_q_a", "attn_kv_a_mqa"),
        ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
    ),
}
PACKED = {"gate_up_proj": ["gate_proj", "up_proj"], "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}


def _reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(str(roundtrip.QUANT_GGUF))


def mixed_layers() -> list[tuple[int, str]]:
    """(block, merged layer) of every merged layer of the fixture with float and quantized shards."""
    types = {t.name: t.tensor_type.name for t in _reader().tensors}
    n_blocks = 1 + max(int(n.split(".")[1]) for n in types if n.startswith("blk."))
    found = []
    for b in range(n_blocks):
        for layer, (parts, _) in MERGED.items():
            got = [types.get(f"blk.{b}.{p}.weight") for p in parts]
            if None not in got and len({t in FLOAT for t in got}) == 2:
                found.append((b, layer))
    return found


def _name_map(b: int, layer: str) -> dict[str, str]:
    parts, hf = MERGED[layer]
    return {f"blk.{b}.{p}.weight": f"model.layers.{b}.{h}.weight" for p, h in zip(parts, hf, strict=True)}


def test_the_fixture_has_both_kinds_of_mixed_merged_layer():
    assert {layer for _, layer in mixed_layers()} == set(MERGED)


def _unquantized_modules(name_map: dict[str, str]) -> list[str]:
    """What GGUFModelLoader.load_model hands GGUFConfig (gguf_loader.py)."""
    loader = GGUFModelLoader.__new__(GGUFModelLoader)
    types = loader._get_gguf_weight_type(
        SimpleNamespace(hf_config=SimpleNamespace()), str(roundtrip.QUANT_GGUF), name_map
    )
    return [n.removesuffix(".weight") for n, t in types.items() if t in FLOAT and n.endswith(".weight")]


@pytest.mark.parametrize(("b", "layer"), mixed_layers())
def test_mixed_merged_layer_is_built_unquantized(b: int, layer: str):
    unquant = _unquantized_modules(_name_map(b, layer))
    assert is_layer_skipped_gguf(f"model.layers.{b}.{layer}", unquant, PACKED)


def _dequantized(name: str) -> torch.Tensor:
    t = next(t for t in _reader().tensors if t.name == name)
    w = gguf.quants.dequantize(t.data, t.tensor_type)
    return torch.from_numpy(np.asarray(w, dtype=np.float32)).reshape(tuple(int(d) for d in reversed(t.shape)))


@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize(("b", "layer"), mixed_layers())
def test_mixed_merged_layer_computes_x_wt(b: int, layer: str, tp: int, monkeypatch: pytest.MonkeyPatch):
    name_map = _name_map(b, layer)
    prefix = f"model.layers.{b}.{layer}"
    config = GGUFConfig(unquantized_modules=_unquantized_modules(name_map))
    config.packed_modules_mapping = PACKED
    items = dict(weight_utils.gguf_quant_weights_iterator(str(roundtrip.QUANT_GGUF), name_map))
    hf_names = list(name_map.values())
    assert sorted(items) == sorted(hf_names)  # every shard as a float .weight, no qweight
    full = [_dequantized(g) for g in name_map]
    rows = [w.shape[0] for w in full]
    fused = layer == "self_attn.fused_qkv_a_proj"  # replicated (disable_tp), as DeepseekV2 builds it
    for module in (linear, parameter):
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: tp)
    for rank in range(1 if fused else tp):
        for module in (linear, parameter):
            monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda r=rank: r)
        m = linear.MergedColumnParallelLinear(
            full[0].shape[1], rows, bias=False, quant_config=config, prefix=prefix,
            params_dtype=torch.float32, disable_tp=fused,
        )
        assert isinstance(m.quant_method, linear.UnquantizedLinearMethod)
        for shard, name in enumerate(hf_names):
            m.weight.weight_loader(m.weight, items[name], shard)
        x = torch.randn(5, full[0].shape[1], generator=torch.Generator().manual_seed(b))
        want_w = torch.cat(full) if fused else torch.cat([w.chunk(tp)[rank] for w in full])
        got = m.quant_method.apply(m, x)
        assert torch.allclose(got, x @ want_w.T, rtol=1e-5, atol=1e-5), (prefix, tp, rank)
