"""The serving slice (glm5_tools.fixtures.slice) through the patched vLLM's GGUF loader.

vLLM's GGUF weight map, built from the slice's own config.json as the service passes it
(``--hf-config-path``), covers every tensor of the file: the target's map every tensor
but the MTP block's, the drafter's map (the config as SpeculativeConfig rewrites it for
``method: mtp``) exactly the MTP block. The weight iterator yields every parameter once,
the K-quants as raw bytes with their file type, kv_b_proj rebuilt from attn_k_b / attn_v_b
at one rank's 8 heads, the indexer dequantized, the experts merged. The slice is written
with a 1,024-token vocabulary (the vocabulary size changes no mapping; the real one makes
gguf-py's reader slow) and 16 experts.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from glm5_tools.fixtures import slice as sl

LAYERS = 2  # layer 0 dense, layer 1 MoE, block 2 the MTP layer


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slice")
    sl.make(out, LAYERS, dense_layers=1, experts=16, vocab_size=1024, jobs=2)
    return out


def _map(slice_dir: Path, mtp: bool = False) -> dict[str, str]:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader
    from vllm.transformers_utils.config import get_config

    config = get_config(str(slice_dir / "hf"), trust_remote_code=False)
    if mtp:
        from vllm.config.speculative import SpeculativeConfig

        config = SpeculativeConfig.hf_config_override(config)
    model = SimpleNamespace(hf_config=config, trust_remote_code=False, model=str(slice_dir / sl.GGUF_NAME),
                            revision=None)
    return dict(GGUFModelLoader(LoadConfig(load_format="gguf"))._get_gguf_weights_map(model))


def _file_tensors(slice_dir: Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(slice_dir / sl.GGUF_NAME)).tensors}


def test_the_maps_cover_the_file(slice_dir: Path):
    in_file = set(_file_tensors(slice_dir))
    mtp_block = {n for n in in_file if n.startswith(f"blk.{LAYERS}.")}
    target = _map(slice_dir)
    assert in_file - mtp_block <= set(target)
    assert not mtp_block & set(target)
    drafter = _map(slice_dir, mtp=True)
    assert {n for n in drafter if n in in_file} == mtp_block


def test_the_iterator_yields_every_parameter_once_at_one_ranks_shapes(slice_dir: Path):
    import gguf
    from vllm.model_executor.model_loader import weight_utils

    types = _file_tensors(slice_dir)
    name_map = _map(slice_dir)
    seen: dict[str, list] = {}
    for name, tensor in weight_utils.gguf_quant_weights_iterator(str(slice_dir / sl.GGUF_NAME), name_map):
        seen.setdefault(name, []).append(tensor)
    assert not [n for n, ts in seen.items() if len(ts) != 1]
    # every quantized tensor of the target arrives raw with its file type
    reverse = {hf: g for g, hf in name_map.items() if g in types}
    for name, (tensor,) in seen.items():
        if name.endswith(".qweight_type"):
            gguf_name = reverse[name.replace(".qweight_type", ".weight")]
            assert gguf.GGMLQuantizationType(int(tensor.item())).name == types[gguf_name], name
    quantized = {n for n in seen if n.endswith(".qweight")}
    want_raw = {hf.replace(".weight", ".qweight") for hf, g in reverse.items()
                if types[g] not in ("F32",) and ".indexer." not in hf and "kv_b_proj" not in hf}
    assert quantized == want_raw
    shape = {n: tuple(ts[0].shape) for n, ts in seen.items()}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}.self_attn."
        assert shape[p + "kv_b_proj.weight"] == (8 * (192 + 256), 512)  # 8 heads: one TP-8 rank
        assert shape[p + "q_b_proj.qweight"][0] == 8 * 256
        assert shape[p + "o_proj.qweight"][0] == 6144
        assert shape[p + "indexer.wq_b.weight"] == (32 * 128, 2048)
    assert shape["model.layers.0.mlp.gate_proj.qweight"][0] == 1536
    assert shape["model.layers.1.mlp.experts.0.gate_proj.qweight"][:2] == (16, 256)
    assert shape["model.layers.1.mlp.experts.0.down_proj.qweight"][:2] == (16, 6144)
    assert shape["model.layers.1.mlp.shared_experts.down_proj.qweight"][0] == 6144
    assert shape["lm_head.qweight"][0] == shape["model.embed_tokens.qweight"][0] == 1024
