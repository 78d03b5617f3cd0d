"""Stage 3: tensor-parallel sharding, each rank's slice against the full tensor.

The sharder under test is vLLM's own: ColumnParallelLinear / RowParallelLinear
weight_loader, run once for each rank of the deployed tensor-parallel size (its rank
and size patched in, nothing distributed started), fed with the dequantized GGUF
tensor; kv_b_proj is first rebuilt from attn_k_b/attn_v_b as the loader does. The
expected slice is cut independently, from the head structure (heads r*H/tp ...). The
stage also checks that row-parallel quantized weights split on whole GGML blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from glm5_tools.diagnostics.gguf_io import GGUFTensor, block_info, dequantize_full, dequantize_rows
from glm5_tools.diagnostics.patching import replaced
from glm5_tools.diagnostics.result import StageResult

NAME = "tensor-parallel sharding"
# A shard is a copy: anything but bit-equality is a fault.
TOLERANCE = 0.0

# (kind "column"|"row", full [out, in] float32, rank, tp) -> the rank's weight
Sharder = Callable[[str, torch.Tensor, int, int], torch.Tensor]
# (attn_k_b [H, lora, nope], attn_v_b [H, v, lora]) -> kv_b_proj [H*(nope+v), lora]
KvbBuilder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rebuild_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """The inverse of llama.cpp's split: k_b holds each head's k_nope block transposed."""
    _, lora, _ = k_b.shape
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, lora)


@contextmanager
def _tp_as(rank: int, tp: int) -> Iterator[None]:
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.parameter as parameter

    answers = {"get_tensor_model_parallel_rank": lambda: rank, "get_tensor_model_parallel_world_size": lambda: tp}
    with replaced(linear, **answers), replaced(parameter, **answers):
        yield


def vllm_sharder(kind: str, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear

    out_f, in_f = full.shape
    with _tp_as(rank, tp):
        cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
        layer = cls(in_f, out_f, bias=False, params_dtype=full.dtype)
        layer.weight_loader(layer.weight, full)
    return layer.weight.data


def _heads(n: int, rank: int, tp: int) -> slice:
    per = n // tp
    return slice(rank * per, (rank + 1) * per)


def _deq(t: GGUFTensor) -> torch.Tensor:
    return torch.from_numpy(dequantize_full(t))


def _deq_expert(t: GGUFTensor, e: int) -> torch.Tensor:
    raw = t.raw[e]
    return torch.from_numpy(dequantize_rows(t, raw.reshape(-1, raw.shape[-1]))).reshape(t.shape[1:])


def pick_layers(n_layers: int, dense_until: int) -> list[int]:
    return sorted({0, min(dense_until, n_layers - 1), n_layers - 1})


def run_stage(
    tensors: dict[str, GGUFTensor],
    cfg: dict[str, Any],
    tp: int,
    sharder: Sharder = vllm_sharder,
    kv_b_builder: KvbBuilder = rebuild_kv_b,
    layers: list[int] | None = None,
    experts: int = 2,
    where: str = "cpu",
) -> StageResult:
    heads = int(cfg["num_attention_heads"])
    nope, rope, v = (int(cfg[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    n_layers = int(cfg["num_hidden_layers"])
    layers = layers if layers is not None else pick_layers(
        n_layers, int(cfg.get("first_k_dense_replace", 0)))
    problems: list[str] = []
    checked: list[str] = []
    notes: list[str] = []  # block alignment: vLLM must then dequantize before splitting
    worst = 0.0

    def compare(label: str, kind: str, full: torch.Tensor,
                expect: Callable[[int], torch.Tensor]) -> None:
        nonlocal worst
        for r in range(tp):
            got = sharder(kind, full, r, tp)
            want = expect(r)
            if got.shape != want.shape:
                problems.append(f"{label} rank {r}: shape {list(got.shape)} != {list(want.shape)}")
                worst = max(worst, float("inf"))
                continue
            d = float((got.float() - want.float()).abs().max()) if want.numel() else 0.0
            if d > TOLERANCE:
                problems.append(f"{label} rank {r}: max abs diff {d:.3e}")
            worst = max(worst, d)
        checked.append(f"{label} ({kind}, {list(full.shape)})")

    def alignment(t: GGUFTensor, dim_len: int) -> None:
        block, _ = block_info(t.qtype)
        if (dim_len // tp) % block:
            notes.append("note: " + f"{t.name}: row-parallel split of {dim_len} over {tp} is not a "
                            f"multiple of {t.type_name}'s {block}-element block")

    for i in layers:
        b = f"blk.{i}"
        if (t := tensors.get(f"{b}.attn_q_b.weight")) is not None:
            full = _deq(t)
            q = full.view(heads, nope + rope, -1)
            compare(t.name, "column", full,
                    lambda r, q=q: q[_heads(heads, r, tp)].reshape(-1, q.shape[-1]))  # type: ignore[misc]
        kb, vb = tensors.get(f"{b}.attn_k_b.weight"), tensors.get(f"{b}.attn_v_b.weight")
        kvb = tensors.get(f"{b}.attn_kv_b.weight")
        if kb is not None and vb is not None:
            k_b, v_b = _deq(kb), _deq(vb)
            full = kv_b_builder(k_b, v_b)

            def kv_expect(r: int, k_b: torch.Tensor = k_b, v_b: torch.Tensor = v_b) -> torch.Tensor:
                hs = _heads(heads, r, tp)
                per_head = [torch.cat([k_b[h].T, v_b[h]], dim=0) for h in range(hs.start, hs.stop)]
                return torch.cat(per_head, dim=0)

            compare(f"{b}.kv_b_proj (from attn_k_b, attn_v_b)", "column", full, kv_expect)
        elif kvb is not None:
            full = _deq(kvb)
            kv = full.view(heads, nope + v, -1)
            compare(kvb.name, "column", full,
                    lambda r, kv=kv: kv[_heads(heads, r, tp)].reshape(-1, kv.shape[-1]))  # type: ignore[misc]
        if (t := tensors.get(f"{b}.attn_output.weight")) is not None:
            full = _deq(t)
            o = full.view(full.shape[0], heads, v)
            compare(t.name, "row", full,
                    lambda r, o=o: o[:, _heads(heads, r, tp)].reshape(o.shape[0], -1))  # type: ignore[misc]
            alignment(t, full.shape[1])
        for stem, kind in (("ffn_gate", "column"), ("ffn_up", "column"), ("ffn_down", "row"),
                           ("ffn_gate_shexp", "column"), ("ffn_up_shexp", "column"),
                           ("ffn_down_shexp", "row")):
            if (t := tensors.get(f"{b}.{stem}.weight")) is None:
                continue
            full = _deq(t)
            dim = 0 if kind == "column" else 1
            compare(t.name, kind, full,
                    lambda r, full=full, dim=dim: full.chunk(tp, dim=dim)[r])  # type: ignore[misc]
            if kind == "row":
                alignment(t, full.shape[1])
        for stem, kind in (("ffn_gate_exps", "column"), ("ffn_up_exps", "column"),
                           ("ffn_down_exps", "row")):
            if (t := tensors.get(f"{b}.{stem}.weight")) is None:
                continue
            for e in sorted({0, t.shape[0] - 1})[:experts]:
                full = _deq_expert(t, e)
                dim = 0 if kind == "column" else 1
                compare(f"{t.name}[expert {e}]", kind, full,
                        lambda r, full=full, dim=dim: full.chunk(tp, dim=dim)[r])  # type: ignore[misc]
            if kind == "row":
                alignment(t, t.shape[2])
    if not checked:
        return StageResult.skip(3, NAME, "no column/row-parallel tensor found in the GGUF")
    details = [f"tp {tp}, layers {layers}: {len(checked)} tensors x {tp} ranks"]
    details.extend(problems[:30])
    details.extend(notes)
    details.extend(f"checked {c}" for c in checked[:12])
    measured = float(len(problems)) if worst != float("inf") else float("inf")
    return StageResult.judge(3, NAME, max(measured, 0.0), TOLERANCE, where, details)
