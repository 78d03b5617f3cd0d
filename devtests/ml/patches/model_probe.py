"""What vLLM builds from a GLM-5 config.json: run in a fresh interpreter on an overlay.

usage: python model_probe.py CONFIG_DIR {dense|sparse}  (prints one JSON object)

Reads the config through vLLM's real config path (ModelConfig -> get_config, with the
patch set of the overlay it runs on) and constructs vLLM's GlmMoeDsaForCausalLM on the
meta device, recording what the model's modules were given: every get_rope call of
deepseek_v2.py (MLA attention and the DSA indexer), every FusedMoE's arguments, the
RMSNorm epsilons, the layer kinds, the indexer sizes.

Two test doubles stand at unreachable GPU boundaries, and only there: vLLM's MLA
attention wrapper (it selects a CUDA attention backend at construction) and FusedMoE
(its kernel backend oracle needs a CUDA platform). Both record their arguments and
build nothing. Everything that reads the config (DeepseekV2Model, DeepseekV2DecoderLayer,
DeepseekV2MLAAttention, Indexer, DeepseekV2MoE, get_rope) is vLLM's own code.

mode dense: the production path (attention backend TRITON_MLA: patch 0004's dense MLA,
no indexer); sparse: vLLM's default DSA path (the indexer is built).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any


def probe(config_dir: str, mode: str) -> dict[str, Any]:
    import torch
    import vllm.model_executor.models.deepseek_v2 as dv2
    from vllm.config import (
        AttentionConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.models.registry import ModelRegistry

    ropes: list[dict[str, Any]] = []
    real_get_rope = dv2.get_rope

    def recording_get_rope(*args: Any, **kwargs: Any) -> Any:
        emb = real_get_rope(*args, **kwargs)
        ropes.append({
            "head_size": args[0] if args else kwargs.get("head_size"),
            "max_position": kwargs.get("max_position"),
            "rope_parameters": dict(kwargs.get("rope_parameters") or {}),
            "is_neox_style": kwargs.get("is_neox_style"),
            "built_class": type(emb).__name__,
            "built_base": float(emb.base),
            "built_rotary_dim": int(emb.rotary_dim),
            "built_is_neox_style": bool(emb.is_neox_style),
            "built_max_position": int(emb.max_position_embeddings),
        })
        return emb

    moes: list[dict[str, Any]] = []

    class FusedMoEDouble(torch.nn.Module):
        """Test double for FusedMoE (needs a CUDA platform): records its arguments."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            moes.append({k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, type(None)))})
            self.quant_method = type("NoMonolithic", (), {"is_monolithic": False})()

    mlas: list[dict[str, Any]] = []

    class MLAWrapperDouble(torch.nn.Module):
        """Test double for MultiHeadLatentAttentionWrapper (selects a CUDA backend)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            mlas.append({k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, type(None)))})

    dv2.get_rope = recording_get_rope
    dv2.FusedMoE = FusedMoEDouble
    dv2.MultiHeadLatentAttentionWrapper = MLAWrapperDouble
    if mode == "sparse":
        # the indexer's top-k buffer is allocated on the platform's device; none here
        dv2.current_platform.device_type = "cpu"

    model_config = ModelConfig(model=config_dir, tokenizer=config_dir, dtype="float32",
                               max_model_len=2048, enforce_eager=True)
    backend = "TRITON_MLA" if mode == "dense" else None
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                             load_config=LoadConfig(load_format="dummy"),
                             attention_config=AttentionConfig(backend=backend))
    hf = model_config.hf_config
    with set_current_vllm_config(vllm_config):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
        with torch.device("meta"):
            model = cls(vllm_config=vllm_config, prefix="")

    layers = model.model.layers
    kinds = ["moe" if isinstance(layer.mlp, dv2.DeepseekV2MoE) else "dense" for layer in layers]
    eps = sorted({float(m.variance_epsilon) for m in model.modules() if isinstance(m, RMSNorm)})
    first = layers[0]
    attn = first.self_attn
    indexer = getattr(attn, "indexer", None)
    moe_layer = next((layer.mlp for layer in layers if isinstance(layer.mlp, dv2.DeepseekV2MoE)), None)
    dense_layer = next((layer.mlp for layer in layers if not isinstance(layer.mlp, dv2.DeepseekV2MoE)), None)
    return {
        "hf_class": type(hf).__name__,
        "hf": {k: v for k, v in vars(hf).items() if isinstance(v, (int, float, str, bool, list, dict, type(None)))},
        "ropes": ropes,
        "moes": moes,
        "mlas": mlas,
        "layer_kinds": kinds,
        "rms_norm_eps": eps,
        "vocab": int(model.model.embed_tokens.org_vocab_size),
        "hidden": int(model.model.embed_tokens.embedding_dim),
        "lm_head_tied": model.lm_head is model.model.embed_tokens,
        "attention": {
            "num_heads": int(attn.num_heads),
            "q_lora_rank": attn.q_lora_rank,
            "kv_lora_rank": int(attn.kv_lora_rank),
            "qk_nope_head_dim": int(attn.qk_nope_head_dim),
            "qk_rope_head_dim": int(attn.qk_rope_head_dim),
            "v_head_dim": int(attn.v_head_dim),
            "max_position_embeddings": int(attn.max_position_embeddings),
            "scaling": float(attn.scaling),
        },
        "indexer": None if indexer is None else {
            "topk_tokens": int(indexer.topk_tokens),
            "n_head": int(indexer.n_head),
            "head_dim": int(indexer.head_dim),
        },
        "moe": None if moe_layer is None else {
            "routed_scaling_factor": float(moe_layer.routed_scaling_factor),
            "n_shared_experts": moe_layer.n_shared_experts,
            "has_e_score_correction_bias": moe_layer.gate.e_score_correction_bias is not None,
            "gate_out": int(moe_layer.gate.output_size),
            "shared_intermediate": int(moe_layer.shared_experts.down_proj.input_size)
            if moe_layer.shared_experts is not None else None,
        },
        "dense_intermediate": None if dense_layer is None else int(dense_layer.down_proj.input_size),
        "dense_act": None if dense_layer is None else type(dense_layer.act_fn).__name__,
        "num_layers": len(layers),
    }


if __name__ == "__main__":
    print("PROBE-JSON " + json.dumps(probe(sys.argv[1], sys.argv[2]), default=str))
