"""Patch 0007: GGUF merged linear layers put their shards in output order.

GLM-5's q_a_proj and kv_a_proj_with_mqa are one layer in vLLM 0.20.2
(DeepSeekV2FusedQkvAProjLinear, shards 0 and 1). With quantized GGUF weights,
GGUFLinearMethod.apply concatenated the shards' outputs in the order their
tensors were LOADED; llama.cpp's files list attn_kv_a_mqa before attn_q_a, so the
layer returned [kv_a, q_a] where the model reads [q_a, kv_a]: the server started
and answered garbage (GPU run 3, docs/validation/e2e_serving.md: top-1 agreement
with llama.cpp on the same GGUF 57/195, KL 0.78).

The layer is built by vLLM and loaded from the tiny fixture's real Q5_K/Q6_K
tensors in the file's order. The one thing replaced is the GGUF matmul kernel
(CUDA only; CI has no GPU): a CPU reference that dequantizes with gguf-py and
multiplies. Its correctness on the GPU is stage 1 of the diagnostics funnel.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import overlay
import pytest
import roundtrip
import torch

pytestmark = pytest.mark.skipif(
    not roundtrip.QUANT_GGUF.is_file(), reason="tiny fixture missing: run scripts/make-tiny-glm5"
)

LAYER = 1


def run_layer() -> dict[str, Any]:
    """fused_qkv_a_proj of LAYER: vLLM's output vs x @ [q_a; kv_a]^T (both dequantized)."""
    import gguf
    import vllm.model_executor.layers.quantization.gguf as vllm_gguf
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.deepseek_v2 import DeepSeekV2FusedQkvAProjLinear

    reader = gguf.GGUFReader(str(roundtrip.QUANT_GGUF))
    tensors = {t.name: t for t in reader.tensors}
    # the file's order, which the weight iterator follows
    order = [n for n in tensors if n in (f"blk.{LAYER}.attn_q_a.weight", f"blk.{LAYER}.attn_kv_a_mqa.weight")]
    shard = {f"blk.{LAYER}.attn_q_a.weight": 0, f"blk.{LAYER}.attn_kv_a_mqa.weight": 1}

    def dequant(t: Any) -> torch.Tensor:
        return torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))

    w_q = dequant(tensors[f"blk.{LAYER}.attn_q_a.weight"])
    w_kv = dequant(tensors[f"blk.{LAYER}.attn_kv_a_mqa.weight"])

    def cpu_mul_mat(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int) -> torch.Tensor:
        w = gguf.quants.dequantize(qweight.numpy(), gguf.GGMLQuantizationType(qweight_type))
        return x @ torch.from_numpy(np.asarray(w, dtype=np.float32)).T

    saved = vllm_gguf.fused_mul_mat_gguf
    vllm_gguf.fused_mul_mat_gguf = cpu_mul_mat
    try:
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            layer = DeepSeekV2FusedQkvAProjLinear(
                w_q.shape[1],
                [w_q.shape[0], w_kv.shape[0]],
                quant_config=vllm_gguf.GGUFConfig(),
                prefix=f"model.layers.{LAYER}.self_attn.fused_qkv_a_proj",
            )
            assert isinstance(layer.quant_method, vllm_gguf.GGUFLinearMethod)
            for name in order:  # types first, then data, as the iterator yields them
                t = tensors[name]
                layer.qweight_type.weight_loader(layer.qweight_type, torch.tensor(int(t.tensor_type)), shard[name])
            for name in order:
                layer.qweight.weight_loader(layer.qweight, torch.tensor(tensors[name].data), shard[name])
            layer.quant_method.process_weights_after_loading(layer)
            x = torch.randn(5, w_q.shape[1], generator=torch.Generator().manual_seed(0))
            got = layer.quant_method.apply(layer, x)
    finally:
        vllm_gguf.fused_mul_mat_gguf = saved
    want = x @ torch.cat([w_q, w_kv]).T
    return {
        "file_order": order,
        "shape": list(got.shape),
        "max_abs_diff": float((got - want).abs().max()) if got.shape == want.shape else None,
    }


def test_file_lists_kv_a_before_q_a() -> None:
    """The premise: load order differs from output order in llama.cpp's files."""
    import gguf

    names = [t.name for t in gguf.GGUFReader(str(roundtrip.QUANT_GGUF)).tensors]
    assert names.index(f"blk.{LAYER}.attn_kv_a_mqa.weight") < names.index(f"blk.{LAYER}.attn_q_a.weight")


def test_fused_qkv_a_proj_output_in_shard_order() -> None:
    got = run_layer()
    assert got["max_abs_diff"] is not None and got["max_abs_diff"] < 1e-4, got


def test_without_0007_shards_come_out_in_load_order(tmp_path) -> None:
    site = overlay.make_overlay(tmp_path / "site", [p for p in overlay.patches() if not p.name.startswith("0007-")])
    code = "import json, test_merged_shard_order as t; print('GLM5-REPORT ' + json.dumps(t.run_layer()))"
    proc = overlay.run_in(site, code)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("GLM5-REPORT ")]
    assert lines, proc.stderr[-3000:]
    got = json.loads(lines[0].removeprefix("GLM5-REPORT "))
    assert got["max_abs_diff"] > 1.0, got  # [kv_a, q_a] read as [q_a, kv_a]
