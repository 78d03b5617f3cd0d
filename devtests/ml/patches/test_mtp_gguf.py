"""Patch 0012: GLM-5's MTP (NextN) layer loads from the GGUF for the speculative drafter.

llama.cpp's converter writes the MTP layer as block num_hidden_layers of the file
(``blk.4.*`` in the tiny fixture: a full decoder layer plus ``blk.4.nextn.{eh_proj,
enorm,hnorm,shared_head_norm}``). Through the patched loader, with the config as vLLM's
SpeculativeConfig rewrites it for ``method: mtp`` (model_type deepseek_mtp), every
parameter of the HF checkpoint's ``model.layers.4`` is found exactly once and equals the
original (within the quantization error for K-quants), and nothing else is loaded. A file
with an MTP tensor the loader does not map, or without one the drafter needs, is refused
with the tensor named. Without 0012 the draft config cannot even be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import overlay
import pytest
import roundtrip

pytestmark = pytest.mark.skipif(
    not roundtrip.QUANT_GGUF.is_file(), reason="tiny fixture missing: run scripts/make-tiny-glm5"
)

VARIANTS = {
    "bf16": [roundtrip.BF16_GGUF],
    "ud-q4_k_xl": [roundtrip.QUANT_GGUF],
    "ud-q4_k_xl-split": roundtrip.SPLIT_GGUF,
}
NEXTN = {
    "blk.4.nextn.eh_proj.weight": "model.layers.4.eh_proj.weight",
    "blk.4.nextn.enorm.weight": "model.layers.4.enorm.weight",
    "blk.4.nextn.hnorm.weight": "model.layers.4.hnorm.weight",
    "blk.4.nextn.shared_head_norm.weight": "model.layers.4.shared_head.norm.weight",
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mtp_layer_round_trip(variant: str) -> None:
    report = roundtrip.roundtrip(VARIANTS[variant], roundtrip.HF_DIR, mtp=True)
    assert report["error"] is None, report["error"]
    assert report["missing"] == [] and report["duplicates"] == [] and report["extra"] == []
    assert report["mismatch"] == {}
    assert report["n_found"] == report["n_main"] > 0
    # eh_proj (a plain nn.Linear in vLLM's DeepSeekMTP), the indexer and kv_b_proj reach
    # the drafter dequantized, never as qweight
    assert not [n for n in report["quantized"] if ".indexer." in n or "kv_b_proj" in n or "eh_proj" in n]


def _draft_model_config(gguf: Path) -> SimpleNamespace:
    from vllm.config.speculative import SpeculativeConfig
    from vllm.transformers_utils.config import get_config

    config = SpeculativeConfig.hf_config_override(get_config(str(roundtrip.HF_DIR), trust_remote_code=False))
    return SimpleNamespace(hf_config=config, trust_remote_code=False, model=str(gguf), revision=None)


def _mtp_map(gguf: Path) -> dict[str, str]:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

    return dict(GGUFModelLoader(LoadConfig(load_format="gguf"))._get_gguf_weights_map(_draft_model_config(gguf)))


def test_the_map_covers_every_mtp_tensor_and_only_those() -> None:
    import gguf

    got = _mtp_map(roundtrip.QUANT_GGUF)
    in_file = {t.name for t in gguf.GGUFReader(roundtrip.QUANT_GGUF).tensors}
    assert set(got) == {n for n in in_file if n.startswith("blk.4.")}
    assert {g: got[g] for g in NEXTN} == NEXTN
    assert all(h.startswith("model.layers.4.") for h in got.values())


class _Reader:
    """gguf.GGUFReader with its tensor list edited (drop: names removed; extra: a copy of
    blk.4.nextn.enorm under another name)."""

    real: Any = None
    drop: tuple[str, ...] = ()
    extra: str = ""

    def __init__(self, path: Any, *args: Any, **kwargs: Any) -> None:
        reader = _Reader.real(path, *args, **kwargs)
        tensors = [t for t in reader.tensors if t.name not in _Reader.drop]
        if _Reader.extra:
            enorm = next(t for t in reader.tensors if t.name == "blk.4.nextn.enorm.weight")
            tensors.append(enorm._replace(name=_Reader.extra))  # ReaderTensor: a NamedTuple
        self.__dict__.update(vars(reader))
        self.tensors = tensors


@pytest.fixture
def edited_reader(monkeypatch: pytest.MonkeyPatch) -> type[_Reader]:
    import gguf

    monkeypatch.setattr(_Reader, "real", gguf.GGUFReader)
    monkeypatch.setattr(gguf, "GGUFReader", _Reader)
    return _Reader


def test_an_unmapped_mtp_tensor_is_refused_by_name(edited_reader: type[_Reader], monkeypatch) -> None:
    monkeypatch.setattr(edited_reader, "extra", "blk.4.nextn.new_norm.weight")
    with pytest.raises(RuntimeError, match=r"not mapped to the drafter: \['blk\.4\.nextn\.new_norm\.weight'\]"):
        _mtp_map(roundtrip.QUANT_GGUF)


def test_copies_of_the_shared_embedding_and_head_are_accepted_unread(edited_reader: type[_Reader],
                                                                     monkeypatch) -> None:
    """nextn.embed_tokens / nextn.shared_head_head (copies of the model's, which llama.cpp's
    converter does not write): vLLM's proposer gives the drafter the target's anyway."""
    monkeypatch.setattr(edited_reader, "extra", "blk.4.nextn.shared_head_head.weight")
    got = _mtp_map(roundtrip.QUANT_GGUF)
    assert "blk.4.nextn.shared_head_head.weight" not in got and set(NEXTN) <= set(got)


@pytest.mark.parametrize("gone", ["blk.4.nextn.shared_head_norm.weight", "blk.4.nextn.hnorm.weight",
                                  "blk.4.attn_kv_a_norm.weight"])
def test_a_missing_mtp_tensor_is_refused_by_name(edited_reader: type[_Reader], monkeypatch, gone: str) -> None:
    """A norm left out would otherwise stay at its initial ones: no error, only a low
    acceptance rate."""
    monkeypatch.setattr(edited_reader, "drop", (gone,))
    with pytest.raises(RuntimeError, match=rf"lacks 1 tensors of the MTP layer\(s\): \['{gone}'\]"):
        _mtp_map(roundtrip.QUANT_GGUF)


def test_without_0012_the_draft_config_is_read_from_the_gguf(tmp_path: Path) -> None:
    """As shipped, SpeculativeConfig builds the draft ModelConfig without the target's
    --hf-config-path: transformers is handed the GGUF itself."""
    site = overlay.make_overlay(tmp_path / "site", [p for p in overlay.patches() if not p.name.startswith("0012-")])
    code = (
        "import sys\n"
        "from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig\n"
        "mc = ModelConfig(model=sys.argv[1], tokenizer=sys.argv[2], hf_config_path=sys.argv[2],\n"
        "                 dtype='float32', max_model_len=256, quantization='gguf')\n"
        "SpeculativeConfig(method='mtp', num_speculative_tokens=1, target_model_config=mc,\n"
        "                  target_parallel_config=ParallelConfig())\n"
    )
    proc = overlay.run_in(site, code, str(roundtrip.QUANT_GGUF), str(roundtrip.HF_DIR))
    assert proc.returncode != 0
    assert "GGUF model with architecture glm-dsa is not supported yet" in proc.stderr


def test_without_0012_the_mtp_layer_is_not_mapped(tmp_path: Path) -> None:
    site = overlay.make_overlay(tmp_path / "site", [p for p in overlay.patches() if not p.name.startswith("0012-")])
    code = "import runpy; runpy.run_module('roundtrip', run_name='__main__')"
    proc = overlay.run_in(site, code, "--mtp", str(roundtrip.QUANT_GGUF), str(roundtrip.HF_DIR))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("GLM5-REPORT ")]
    assert lines, proc.stderr[-3000:]
    report = json.loads(lines[0].removeprefix("GLM5-REPORT "))
    assert report["error"] == "RuntimeError: Unknown gguf model_type: deepseek_mtp"


def test_spec_decode_config_is_accepted_by_triton_mla_sparse() -> None:
    """0011 refused any speculative config in TRITON_MLA_SPARSE's metadata builder; 0012
    lifts it (its kernels read each token's request and context length)."""
    import inspect

    from vllm.model_executor.layers import sparse_attn_indexer
    from vllm.v1.attention.backends.mla import triton_mla

    assert "does not support speculative decoding" not in inspect.getsource(triton_mla)
    assert "no speculative decoding" not in inspect.getsource(sparse_attn_indexer.sparse_attn_indexer_triton)
