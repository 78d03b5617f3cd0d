"""Stage 2: tensor-name mapping, every model parameter to a GGUF tensor and back.

The parameters come from the HF checkpoint layout the config describes (or, where the
model directory has safetensors, from their headers). The forward map under test is the
one vLLM's GGUF loader builds (gguf-py's tensor-name map for the architecture, with the
loader's special cases: per-expert weights into the merged *_exps tensors, the router
bias, and kv_b_proj rebuilt from attn_k_b/attn_v_b). The way back is gguf-py's own table,
read in reverse. Checked: nothing unmapped, nothing unused, nothing used twice, shapes
equal, and each name comes back to itself.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glm5_tools.diagnostics.gguf_io import GGUFTensor
from glm5_tools.diagnostics.result import StageResult

NAME = "tensor-name mapping"
# hf name -> the GGUF tensor names it is loaded from
Mapper = Callable[[str], list[str]]

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.\d+\.(gate|up|down)_proj\.weight$")
_BLK = re.compile(r"^blk\.(\d+)\.")


def hf_params_from_config(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the HF checkpoint a GLM-5 / DeepSeek-V3 config makes."""
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    lora, rope = int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"])
    nope, v = int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    q_lora = cfg.get("q_lora_rank")
    vocab = int(cfg["vocab_size"])
    n_exp = int(cfg.get("n_routed_experts") or 0)
    moe_i = int(cfg.get("moe_intermediate_size") or 0)
    n_shared = int(cfg.get("n_shared_experts") or 0)
    dense_until = int(cfg.get("first_k_dense_replace", 0))
    p: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
    }
    if not cfg.get("tie_word_embeddings", False):
        p["lm_head.weight"] = (vocab, h)
    for i in range(int(cfg["num_hidden_layers"])):
        pre = f"model.layers.{i}"
        a = f"{pre}.self_attn"
        p[f"{pre}.input_layernorm.weight"] = (h,)
        p[f"{pre}.post_attention_layernorm.weight"] = (h,)
        if q_lora:
            p[f"{a}.q_a_proj.weight"] = (int(q_lora), h)
            p[f"{a}.q_a_layernorm.weight"] = (int(q_lora),)
            p[f"{a}.q_b_proj.weight"] = (heads * (nope + rope), int(q_lora))
        else:
            p[f"{a}.q_proj.weight"] = (heads * (nope + rope), h)
        p[f"{a}.kv_a_proj_with_mqa.weight"] = (lora + rope, h)
        p[f"{a}.kv_a_layernorm.weight"] = (lora,)
        p[f"{a}.kv_b_proj.weight"] = (heads * (nope + v), lora)
        p[f"{a}.o_proj.weight"] = (h, heads * v)
        if cfg.get("index_topk"):
            ih, idim = int(cfg["index_n_heads"]), int(cfg["index_head_dim"])
            p[f"{a}.indexer.wq_b.weight"] = (ih * idim, int(q_lora or h))
            p[f"{a}.indexer.wk.weight"] = (idim, h)
            p[f"{a}.indexer.k_norm.weight"] = (idim,)
            p[f"{a}.indexer.k_norm.bias"] = (idim,)
            p[f"{a}.indexer.weights_proj.weight"] = (ih, h)
        m = f"{pre}.mlp"
        if i < dense_until or not n_exp:
            inter = int(cfg["intermediate_size"])
            p[f"{m}.gate_proj.weight"] = (inter, h)
            p[f"{m}.up_proj.weight"] = (inter, h)
            p[f"{m}.down_proj.weight"] = (h, inter)
            continue
        p[f"{m}.gate.weight"] = (n_exp, h)
        if cfg.get("topk_method", "noaux_tc") == "noaux_tc":
            p[f"{m}.gate.e_score_correction_bias"] = (n_exp,)
        for e in range(n_exp):
            p[f"{m}.experts.{e}.gate_proj.weight"] = (moe_i, h)
            p[f"{m}.experts.{e}.up_proj.weight"] = (moe_i, h)
            p[f"{m}.experts.{e}.down_proj.weight"] = (h, moe_i)
        if n_shared:
            p[f"{m}.shared_experts.gate_proj.weight"] = (moe_i * n_shared, h)
            p[f"{m}.shared_experts.up_proj.weight"] = (moe_i * n_shared, h)
            p[f"{m}.shared_experts.down_proj.weight"] = (h, moe_i * n_shared)
    return p


def hf_params_from_safetensors(model_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """Names and shapes read from the safetensors headers, where the directory has them."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for k, info in header.items():
            if k != "__metadata__":
                out[k] = tuple(int(d) for d in info["shape"])
    return out


def gguf_arch_map(arch: str, n_blocks: int) -> Any:
    import gguf

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    return gguf.get_tensor_name_map(arch_id, n_blocks)


def loader_mapper(arch: str, n_blocks: int, gguf_names: set[str]) -> Mapper:
    """The forward map as vLLM's GGUF loader (with the glm-dsa patches) builds it."""
    name_map = gguf_arch_map(arch, n_blocks)

    def fwd(hf: str) -> list[str]:
        if m := _EXPERT.match(hf):
            g = name_map.get_name(f"{m.group(1)}.{m.group(2)}_proj.weight",
                                  try_suffixes=(".weight",))
            return [g] if g else []
        if hf.endswith(".mlp.gate.e_score_correction_bias"):
            g = name_map.get_name(hf[: -len("_bias")])
            return [f"{g}.bias"] if g else []
        if hf.endswith(".self_attn.kv_b_proj.weight"):
            g = name_map.get_name(hf, try_suffixes=(".weight",))
            if g and g not in gguf_names:
                base = hf[: -len("kv_b_proj.weight")]
                kb = name_map.get_name(base + "k_b_proj.weight", try_suffixes=(".weight",))
                vb = name_map.get_name(base + "v_b_proj.weight", try_suffixes=(".weight",))
                return [n for n in (kb, vb) if n]
            return [g] if g else []
        g = name_map.get_name(hf, try_suffixes=(".weight", ".bias"))
        return [g] if g else []

    return fwd


def reverse_candidates(arch: str, n_blocks: int) -> dict[str, set[str]]:
    """gguf tensor name (no suffix) -> the HF module names gguf-py's table lists for it."""
    name_map = gguf_arch_map(arch, n_blocks)
    rev: dict[str, set[str]] = {}
    for hf_key, (_, gguf_name) in name_map.mapping.items():
        rev.setdefault(gguf_name, set()).add(hf_key)
    return rev


def _hf_module(hf: str) -> str:
    if m := _EXPERT.match(hf):
        return f"{m.group(1)}.{m.group(2)}_proj"
    for suffix in (".weight", ".bias", "_bias"):
        if hf.endswith(suffix):
            return hf[: -len(suffix)]
    return hf


def _strip(gname: str) -> str:
    for suffix in (".weight", ".bias"):
        if gname.endswith(suffix):
            return gname[: -len(suffix)]
    return gname


def _expected_gguf_shapes(hf: str, shape: tuple[int, ...], targets: list[str],
                          cfg: dict[str, Any]) -> list[tuple[int, ...]]:
    if _EXPERT.match(hf):
        return [(int(cfg["n_routed_experts"]), *shape)]
    if hf.endswith("kv_b_proj.weight") and len(targets) == 2:
        heads, lora = int(cfg["num_attention_heads"]), int(cfg["kv_lora_rank"])
        nope, v = int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
        return [(heads, lora, nope), (heads, v, lora)]
    return [shape]


def run_stage(
    hf_params: dict[str, tuple[int, ...]],
    tensors: dict[str, GGUFTensor],
    cfg: dict[str, Any],
    arch: str,
    mapper: Mapper | None = None,
) -> StageResult:
    n_layers = int(cfg["num_hidden_layers"])
    n_blocks = n_layers + int(cfg.get("num_nextn_predict_layers") or 0)
    names = set(tensors)
    fwd = mapper or loader_mapper(arch, n_blocks, names)
    rev = reverse_candidates(arch, n_blocks)
    problems: list[str] = []
    used: dict[str, list[str]] = {}
    for hf, shape in sorted(hf_params.items()):
        targets = fwd(hf)
        present = [t for t in targets if t in names]
        if not targets or len(present) != len(targets):
            problems.append(f"unmapped: {hf} -> {targets or 'nothing'} (not in the GGUF)")
            continue
        for t in present:
            used.setdefault(t, []).append(hf)
            back = rev.get(_strip(t), set())
            module = _hf_module(hf)
            split_ok = hf.endswith("kv_b_proj.weight") and (
                module.replace("kv_b_proj", "k_b_proj") in back
                or module.replace("kv_b_proj", "v_b_proj") in back
            )
            if module not in back and not split_ok:
                problems.append(f"round trip: {hf} -> {t} -> {sorted(back) or 'nothing'}")
        want = _expected_gguf_shapes(hf, shape, present, cfg)
        got = [tensors[t].shape for t in present]
        if want != got:
            problems.append(f"shape: {hf} {list(shape)} -> {present} {[list(g) for g in got]}")
    for t, hfs in used.items():
        if len({_hf_module(h) for h in hfs}) > 1 and not _EXPERT.match(hfs[0]):
            problems.append(f"used twice: {t} <- {sorted(hfs)}")
    extra_ok = []
    for t in sorted(names - set(used)):
        blk = _BLK.match(t)
        if t.startswith("rope_freqs") or (blk and int(blk.group(1)) >= n_layers):
            extra_ok.append(t)  # MTP / rope tables: vLLM's loader skips them by design
        else:
            problems.append(f"unused: GGUF tensor {t} is loaded into no parameter")
    details = [f"{len(hf_params)} parameters, {len(names)} GGUF tensors, "
               f"{len(extra_ok)} skipped by design (MTP layers, rope tables)"]
    details.extend(problems[:40])
    if len(problems) > 40:
        details.append(f"... and {len(problems) - 40} more")
    return StageResult.judge(2, NAME, float(len(problems)), 0.0, "cpu", details)
