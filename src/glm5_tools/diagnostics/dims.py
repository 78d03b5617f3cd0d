"""The MLA dimensions of a GLM-5 (glm_moe_dsa / DeepSeek-V3 style) HF config."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def load_config(path: Path) -> dict[str, Any]:
    """config.json, or a directory holding one."""
    if path.is_dir():
        path = path / "config.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _yarn_mscale(scale: float, mscale: float) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MLADims:
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    hidden_size: int
    softmax_scale: float

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def per_rank(self, tp: int) -> MLADims:
        if self.num_heads % tp:
            raise ValueError(f"{self.num_heads} heads do not split over tensor parallel {tp}")
        return MLADims(self.num_heads // tp, self.kv_lora_rank, self.qk_nope_head_dim,
                       self.qk_rope_head_dim, self.v_head_dim, self.q_lora_rank,
                       self.hidden_size, self.softmax_scale)

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> MLADims:
        nope = int(cfg["qk_nope_head_dim"])
        rope = int(cfg["qk_rope_head_dim"])
        scale = (nope + rope) ** -0.5
        # DeepSeek-V3-style yarn: the softmax scale takes mscale_all_dim squared
        # (vLLM's DeepseekV2MLAAttention does the same).
        rs = cfg.get("rope_scaling") or {}
        if rs and rs.get("type", rs.get("rope_type")) in ("yarn", "deepseek_yarn"):
            m = _yarn_mscale(float(rs.get("factor", 1.0)), float(rs.get("mscale_all_dim", 0.0)))
            scale = scale * m * m
        q_lora = cfg.get("q_lora_rank")
        return cls(
            num_heads=int(cfg["num_attention_heads"]),
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=int(cfg["v_head_dim"]),
            q_lora_rank=int(q_lora) if q_lora else None,
            hidden_size=int(cfg["hidden_size"]),
            softmax_scale=scale,
        )
