"""kv_b_proj rebuilt from llama.cpp's attn_k_b/attn_v_b, sharded for TP 1/2/4/8.

Each rank's slice, loaded through vLLM's own ColumnParallelLinear.weight_loader
(tensor-parallel rank and size faked in the linear module, no process group),
must equal the original kv_b_proj rows of the heads that rank owns.
"""

from __future__ import annotations

import pytest
import torch
import vllm.model_executor.layers.linear as linear
import vllm.model_executor.parameter as parameter
from vllm.model_executor.layers.quantization.gguf import GGUFConfig
from vllm.model_executor.model_loader import weight_utils

# GLM-5's real attention sizes (config.json): 64 heads, kv_lora_rank 512,
# qk_nope_head_dim 192, v_head_dim 256.
HEADS, LORA, NOPE, V = 64, 512, 192, 256
PREFIX = "model.layers.3.self_attn.kv_b_proj"


class _GGUFTensor:
    """The two attributes of a gguf ReaderTensor the iterator reads, for F32 data."""

    def __init__(self, name: str, data: torch.Tensor) -> None:
        import gguf

        self.name = name
        self.data = data.numpy()
        self.tensor_type = gguf.GGMLQuantizationType.F32
        self.shape = list(reversed(data.shape))  # GGUF order (ne)


def llama_cpp_split(kv_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The split llama.cpp's converter writes (conversion/deepseek.py, glm.py)."""
    per_head = kv_b.view(HEADS, NOPE + V, LORA)
    k_b, v_b = torch.split(per_head, [NOPE, V], dim=1)
    return k_b.transpose(1, 2).contiguous(), v_b.contiguous()


def rebuilt(kv_b: torch.Tensor) -> torch.Tensor:
    k_b, v_b = llama_cpp_split(kv_b)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    name = f"{PREFIX}.weight"
    assert weight_utils._gguf_dequantized_weight(_GGUFTensor("blk.3.attn_k_b.weight", k_b), name, pending) is None
    item = weight_utils._gguf_dequantized_weight(_GGUFTensor("blk.3.attn_v_b.weight", v_b), name, pending)
    assert item is not None and item[0] == name and not pending
    return item[1]


def test_rebuild_is_the_original() -> None:
    kv_b = torch.randn(HEADS * (NOPE + V), LORA)
    assert torch.equal(rebuilt(kv_b), kv_b)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_each_rank_gets_its_heads(tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    kv_b = torch.randn(HEADS * (NOPE + V), LORA)
    full = rebuilt(kv_b)
    heads_per_rank = HEADS // tp
    for module in (linear, parameter):
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: tp)
    for rank in range(tp):
        for module in (linear, parameter):
            monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda r=rank: r)
        layer = linear.ColumnParallelLinear(
            LORA,
            HEADS * (NOPE + V),
            bias=False,
            quant_config=GGUFConfig(unquantized_modules=[PREFIX]),
            prefix=PREFIX,
            params_dtype=torch.float32,
        )
        assert isinstance(layer.quant_method, linear.UnquantizedLinearMethod)
        layer.weight.weight_loader(layer.weight, full)
        want = kv_b.view(HEADS, NOPE + V, LORA)[rank * heads_per_rank : (rank + 1) * heads_per_rank].reshape(-1, LORA)
        assert torch.equal(layer.weight.data, want), f"tp={tp} rank={rank}"
