"""Stage 4: the GGUF linear and MoE layers as vLLM assembles them, against the dequantized weights.

Stage 3 checks each tensor's slice; this stage checks the layers the model really runs.
The attention and MLP projections of the first, first-MoE and last layer are built with
vLLM's own linear classes and GGUF quantization config, loaded with the deployed file's
raw tensors through vLLM's weight loaders in the file's order (as the weight iterator
feeds them: every type first, then the data), for every tensor-parallel rank (rank and
size patched in), and applied to random inputs of several batch sizes. The output is
compared with x @ W^T, W the gguf-py dequantization of the same tensors put in the
model's order and cut for the rank. A merged layer whose shards come out in load order
(GLM-5's fused_qkv_a_proj: llama.cpp lists attn_kv_a_mqa before attn_q_a, patch 0007),
a row split inside a quantization block, or a wrong GGUF matmul kernel fails here.

On a GPU the matmul is vLLM's GGUF kernel (ggml_mul_mat_vec_a8 for small batches,
ggml_mul_mat_a8 for larger ones). Without one (CI) gguf-py's dequantization and a float32
matmul stand in for the kernel; the assembly (loaders, shard order, padding) is still
vLLM's, and the `where` column says which ran.

The routed experts of the same layers are checked here too (stage_experts): vLLM's real
FusedMoE with the GGUF MoE method, loaded through its weight_loader with expert and shard
ids as the GGUF loader feeds the merged ffn_{gate,up,down}_exps tensors, for every rank,
expert by expert against the file, and the MoE output for a routing that picks known
experts (vLLM's GGUF MoE kernels on a GPU; on the CPU a gguf-py stand-in).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from glm5_tools.diagnostics import stage_experts
from glm5_tools.diagnostics.gguf_io import FLOAT_TYPES, GGUFTensor, block_info, dequantize_full
from glm5_tools.diagnostics.patching import replaced
from glm5_tools.diagnostics.result import StageResult
from glm5_tools.diagnostics.stage_sharding import _tp_as, pick_layers

STAGE = 4
NAME = "gguf linear and moe layers"
# max |layer(x) - x @ W^T| / max |x @ W^T|, per layer, rank and batch size.
# CPU: the same float32 products summed in another order (measured < 1e-6).
# GPU: vLLM's kernels quantize the activations to 8 bits per 32 values (q8_1) and
# accumulate in float32 from bfloat16 inputs; a shard in the wrong place or a split
# inside a block moves outputs by their own size (measured 0.6 to 1.0 on the fixture).
TOLERANCE_CPU = 1e-4
TOLERANCE_GPU = 3e-2
BATCHES = (1, 5, 33)  # 1 and 5: the small-batch kernel (MMVQ); 33: the batched one (MMQ)

# (x, raw quantized rows [out, bytes], ggml type) -> x @ W^T
MatMul = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def cpu_reference_matmul(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int) -> torch.Tensor:
    """Stands in for vLLM's GGUF kernel where there is no GPU: gguf-py dequantization."""
    import gguf

    w = gguf.quants.dequantize(qweight.cpu().numpy(), gguf.GGMLQuantizationType(qweight_type))
    return x @ torch.from_numpy(np.asarray(w, dtype=np.float32)).to(x.device, x.dtype).T


@dataclass
class Spec:
    """One layer: its vLLM class, its GGUF tensors with their shard ids, how TP cuts it."""

    label: str
    kind: str  # "replicated" (disable_tp), "column", "merged" (column, per shard), "row"
    parts: list[tuple[GGUFTensor, int | None]]  # in the file's order


def layer_specs(tensors: dict[str, GGUFTensor], cfg: dict[str, Any], layers: list[int]) -> list[Spec]:
    order = {name: i for i, name in enumerate(tensors)}
    specs: list[Spec] = []

    def add(label: str, kind: str, names: list[tuple[str, int | None]]) -> None:
        found = [(tensors[n], s) for n, s in names if n in tensors]
        if len(found) == len(names):
            found.sort(key=lambda p: order[p[0].name])
            specs.append(Spec(label, kind, found))

    for i in layers:
        b = f"blk.{i}"
        if cfg.get("q_lora_rank"):
            add(f"{b} fused_qkv_a_proj [attn_q_a; attn_kv_a_mqa]", "replicated",
                [(f"{b}.attn_q_a.weight", 0), (f"{b}.attn_kv_a_mqa.weight", 1)])
            add(f"{b} q_b_proj", "column", [(f"{b}.attn_q_b.weight", None)])
        add(f"{b} o_proj", "row", [(f"{b}.attn_output.weight", None)])
        for suffix, what in (("", "mlp"), ("_shexp", "shared_experts")):
            add(f"{b} {what}.gate_up_proj [ffn_gate{suffix}; ffn_up{suffix}]", "merged",
                [(f"{b}.ffn_gate{suffix}.weight", 0), (f"{b}.ffn_up{suffix}.weight", 1)])
            add(f"{b} {what}.down_proj", "row", [(f"{b}.ffn_down{suffix}.weight", None)])
    return specs


@contextmanager
def _kernel(matmul: MatMul | None) -> Iterator[None]:
    """Put matmul in place of vLLM's GGUF matmul for the stage (None: vLLM's own)."""
    import vllm.model_executor.layers.quantization.gguf as vllm_gguf

    with replaced(vllm_gguf, fused_mul_mat_gguf=matmul):
        yield


def _vllm_dequantizes_mixed_merged() -> bool:
    """Whether the vLLM in use has patch 0010 (mixed float/quantized merged layers)."""
    from vllm.model_executor.model_loader import weight_utils

    return hasattr(weight_utils, "_gguf_mixed_merged")


def _build(spec: Spec, rank: int, tp: int) -> torch.nn.Module:
    """The layer as the model builds it, loaded as the loader loads it."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.quantization.gguf import GGUFConfig

    rows = [p[0].shape[0] for p in sorted(spec.parts, key=lambda p: p[1] or 0)]
    in_f = spec.parts[0][0].shape[1]
    floats = all(t.qtype in FLOAT_TYPES for t, _ in spec.parts)
    if not floats and any(t.qtype in FLOAT_TYPES for t, _ in spec.parts):
        # A merged layer with float and quantized shards: the loader builds it as
        # the patched vLLM does (0010: every shard dequantized, the layer unquantized),
        # or says that this vLLM refuses it.
        if not _vllm_dequantizes_mixed_merged():
            raise ValueError("float and quantized shards in one merged layer: vLLM 0.20.2 refuses it "
                             "('Detected some but not all shards ... are quantized'; patch 0010)")
        floats = True
    prefix = f"diagnose.{spec.label.split()[1]}"
    config = GGUFConfig(unquantized_modules=[prefix] if floats else [])
    with _tp_as(rank, tp):
        layer: torch.nn.Module
        if spec.kind == "replicated":
            try:
                from vllm.model_executor.models.deepseek_v2 import DeepSeekV2FusedQkvAProjLinear

                layer = DeepSeekV2FusedQkvAProjLinear(in_f, rows, quant_config=config, prefix=prefix)
            except ImportError:
                layer = MergedColumnParallelLinear(in_f, rows, bias=False, quant_config=config,
                                                   disable_tp=True, prefix=prefix)
        elif spec.kind == "merged":
            layer = MergedColumnParallelLinear(in_f, rows, bias=False, quant_config=config, prefix=prefix)
        elif spec.kind == "column":
            layer = ColumnParallelLinear(in_f, rows[0], bias=False, quant_config=config, prefix=prefix)
        else:
            layer = RowParallelLinear(in_f, rows[0], bias=False, quant_config=config, prefix=prefix)

        def load(param: Any, data: torch.Tensor, shard: int | None) -> None:
            if shard is None:
                param.weight_loader(param, data)
            else:
                param.weight_loader(param, data, shard)

        if floats:
            for t, shard in spec.parts:
                load(layer.weight, torch.from_numpy(dequantize_full(t)), shard)
        else:
            for t, shard in spec.parts:  # the types first, as the weight iterator yields them
                load(layer.qweight_type, torch.tensor(t.qtype), shard)
            for t, shard in spec.parts:
                load(layer.qweight, torch.from_numpy(np.array(t.raw)), shard)
            layer.quant_method.process_weights_after_loading(layer)
    return layer


def _split_inside_block(spec: Spec, tp: int) -> str:
    """A row-parallel layer cuts its input dimension; quantized rows split only on blocks."""
    t = spec.parts[0][0]
    if spec.kind != "row" or t.qtype in FLOAT_TYPES or tp == 1:
        return ""
    block, _ = block_info(t.qtype)
    per_rank = t.shape[1] // tp
    if per_rank % block == 0:
        return ""
    return (f"{t.shape[1]} inputs over {tp} ranks is {per_rank} per rank, inside {t.type_name}'s "
            f"{block}-value blocks: vLLM's GGUF loader cannot shard it at this tensor-parallel size")


def dequantized(spec: Spec) -> list[torch.Tensor]:
    """The layer's tensors dequantized by gguf-py, in shard order."""
    return [torch.from_numpy(dequantize_full(t)) for t, _ in sorted(spec.parts, key=lambda p: p[1] or 0)]


def expected_weight(spec: Spec, rank: int, tp: int, full: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The rank's [out, in] weight, cut independently from the dequantized tensors."""
    full = full if full is not None else dequantized(spec)
    if spec.kind == "replicated":
        return torch.cat(full)
    if spec.kind in ("column", "merged"):
        return torch.cat([w.chunk(tp, dim=0)[rank] for w in full])
    return full[0].chunk(tp, dim=1)[rank]


def run_stage(
    tensors: dict[str, GGUFTensor],
    cfg: dict[str, Any],
    tp: int,
    device: str = "cpu",
    matmul: MatMul | None = None,
    layers: list[int] | None = None,
    moe_kernel: stage_experts.MoEKernel | None = None,
) -> StageResult:
    """matmul: the GGUF matmul under test (None: vLLM's own kernel, on a GPU; on the CPU,
    cpu_reference_matmul stands in for it); moe_kernel likewise for the routed experts
    (stage_experts.cpu_reference_moe on the CPU)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    on_gpu = device != "cpu"
    if matmul is None and not on_gpu:
        matmul = cpu_reference_matmul
    if moe_kernel is None and not on_gpu:
        moe_kernel = stage_experts.cpu_reference_moe
    layers = layers if layers is not None else pick_layers(
        int(cfg["num_hidden_layers"]), int(cfg.get("first_k_dense_replace", 0)))
    specs = layer_specs(tensors, cfg, layers)
    if not specs and not stage_experts.moe_specs(tensors, layers):
        return StageResult.skip(STAGE, NAME, "no linear layer of the model found in the GGUF")
    tolerance = TOLERANCE_GPU if on_gpu else TOLERANCE_CPU
    dtype = torch.bfloat16 if on_gpu else torch.float32
    gen = torch.Generator().manual_seed(0)
    problems: list[str] = []
    checked: list[str] = []
    worst = 0.0
    vllm_config = VllmConfig(device_config=DeviceConfig(device="cuda" if on_gpu else "cpu"))
    with set_current_vllm_config(vllm_config), _kernel(matmul):
        for spec in specs:
            ranks = [0] if spec.kind == "replicated" else list(range(tp))
            label_worst = 0.0
            split = _split_inside_block(spec, tp)
            if split:
                problems.append(f"{spec.label}: {split}")
                label_worst, ranks = math.inf, []
            full = dequantized(spec) if ranks else []
            for rank in ranks:
                try:
                    layer = _build(spec, rank, tp).to(device)
                except (RuntimeError, ValueError, AssertionError) as exc:
                    problems.append(f"{spec.label} rank {rank}: vLLM could not load it: {exc}"[:300])
                    label_worst = math.inf
                    continue
                want_w = expected_weight(spec, rank, tp, full)
                for n in BATCHES:
                    x = torch.randn(n, want_w.shape[1], generator=gen).to(device, dtype)
                    try:
                        got = layer.quant_method.apply(layer, x).float().cpu()
                    except (RuntimeError, ValueError) as exc:
                        problems.append(f"{spec.label} rank {rank} batch {n}: {exc}"[:300])
                        label_worst = math.inf
                        continue
                    want = x.float().cpu() @ want_w.T
                    if got.shape != want.shape:
                        problems.append(f"{spec.label} rank {rank} batch {n}: shape {list(got.shape)} "
                                        f"!= {list(want.shape)}")
                        label_worst = math.inf
                        continue
                    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))
                    if not err <= tolerance:
                        problems.append(f"{spec.label} rank {rank} batch {n}: rel err {err:.3e}")
                    label_worst = err if math.isnan(err) else max(label_worst, err)
            worst = label_worst if math.isnan(label_worst) else max(worst, label_worst)
            types = "+".join(t.type_name for t, _ in spec.parts)
            checked.append(f"{spec.label} ({types}, {spec.kind}, {len(ranks)} rank(s)): "
                           f"max rel err {label_worst:.3e}")
        with stage_experts.moe_kernel(moe_kernel):
            w_err, out_err, moe_problems, moe_checked, n_moe = stage_experts.check_experts(
                tensors, layers, tp, device, moe_kernel, gen)
    problems.extend(moe_problems)
    checked.extend(moe_checked)
    worst = max(worst, out_err, w_err) if not math.isnan(out_err) else out_err
    if w_err > stage_experts.TOLERANCE_WEIGHTS and worst <= tolerance:
        worst = math.inf  # an expert's weights not the file's fail whatever the outputs say
    where = ("gpu: vLLM GGUF layers, FusedMoE and their kernels" if on_gpu
             else "cpu: vLLM GGUF layer and FusedMoE assembly, gguf-py in place of the kernels")
    details = [f"tp {tp}, layers {layers}, batches {list(BATCHES)}: {len(specs)} layers, "
               f"{n_moe} routed-expert layers (tokens {list(stage_experts.TOKENS)})"]
    details.extend(problems[:30])
    details.extend(checked)
    return StageResult.judge(STAGE, NAME, worst, tolerance, where, details)

