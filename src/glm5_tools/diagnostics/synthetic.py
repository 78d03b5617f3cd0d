"""A tiny synthetic glm-dsa GGUF for the funnel's own tests and GPU runs.

Written with gguf-py from the tensor list of an HF config (stage_mapping's), laid out as
llama.cpp's converter lays out GLM-5: per-expert weights merged into *_exps, kv_b_proj
split into attn_k_b (each head's k block transposed) and attn_v_b. Quantized types are
filled with random blocks whose scales are valid halves, so every GGML layout UD-Q4_K_XL
uses (Q4_K, Q5_K, Q6_K, Q8_0) is present; row-parallel tensors get a K-quant only where
their input dimension splits into whole blocks up to TP 8 (else Q8_0), as GLM-5's do;
a layer's gate and up experts share one type. The expert count is the config's
n_routed_experts (the funnel's tests use 16, past the "10" before "2" of a string sort).
Not a model that says anything: the llama.cpp fixture (glm5_tools.fixtures) is that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from glm5_tools.diagnostics.stage_mapping import _EXPERT, hf_params_from_config, loader_mapper

Q8_0, Q4_K, Q5_K, Q6_K, F32 = 8, 12, 13, 14, 0
_BYTES = {Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}


def _random_quant(shape: tuple[int, ...], qtype: int, rng: np.random.Generator) -> np.ndarray:
    block, nbytes = _BYTES[qtype]
    n_blocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.02, size=(n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q6_K:
        raw[:, 208:210] = halves[:, 0:2]
    else:
        raw[:, 0:2] = halves[:, 0:2]
        if qtype in (Q4_K, Q5_K):
            raw[:, 2:4] = halves[:, 2:4]
    return raw.reshape(*shape[:-1], shape[-1] // block * nbytes)


# Row-parallel layers split their input dimension across ranks; a quantized row splits
# only on whole blocks (GLM-5's dims split on 256-value blocks up to TP 8).
_ROW_PARALLEL = ("attn_output", "ffn_down")
MAX_TP = 8


def _qtype_for(name: str, shape: tuple[int, ...], i: int) -> int:
    if len(shape) == 1 or "norm" in name or "exp_probs" in name or "ffn_gate_inp" in name:
        return F32
    block = 256 * MAX_TP if any(part in name for part in _ROW_PARALLEL) else 256
    if shape[-1] % block:
        return Q8_0
    return (Q4_K, Q5_K, Q6_K, Q8_0)[i % 4]


def gguf_layout(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy shape, as llama.cpp lays GLM-5 out."""
    params = hf_params_from_config(cfg)
    heads, lora = int(cfg["num_attention_heads"]), int(cfg["kv_lora_rank"])
    nope, v = int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    fwd = loader_mapper("glm-dsa", int(cfg["num_hidden_layers"]), set())
    out: dict[str, tuple[int, ...]] = {}
    for hf, shape in params.items():
        if hf.endswith("kv_b_proj.weight"):
            b = hf.split(".")[2]
            out[f"blk.{b}.attn_k_b.weight"] = (heads, lora, nope)
            out[f"blk.{b}.attn_v_b.weight"] = (heads, v, lora)
            continue
        (g,) = fwd(hf)
        out[g] = (int(cfg["n_routed_experts"]), *shape) if _EXPERT.match(hf) else shape
    return out


def write_gguf(cfg: dict[str, Any], path: Path, seed: int = 0) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "glm-dsa")
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    layout = sorted(gguf_layout(cfg).items())
    qtypes = {name: _qtype_for(name, shape, i) for i, (name, shape) in enumerate(layout)}
    for name in qtypes:
        # vLLM's GGUF MoE kernels take one type for gate and up (w13), as llama.cpp's
        # quantizations give them (patch 0007 refuses a pair of two types)
        if name.endswith(".ffn_up_exps.weight"):
            qtypes[name] = qtypes[name.replace(".ffn_up_exps.", ".ffn_gate_exps.")]
    for name, shape in layout:
        qt = qtypes[name]
        if qt == F32:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
        else:
            w.add_tensor(name, _random_quant(shape, qt, rng),
                         raw_dtype=gguf.GGMLQuantizationType(qt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
