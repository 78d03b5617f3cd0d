"""Stage 4, routed experts: vLLM's FusedMoE with the GGUF MoE method, per expert id.

The merged expert tensors (blk.N.ffn_{gate,up,down}_exps, [experts, out, in]) reach the
model as vLLM's GGUF loader hands them over: named for expert 0
(model.layers.N.mlp.experts.0.{gate,up,down}_proj.qweight_type, then .qweight), routed
by the model's expert mapping (FusedMoE.make_expert_params_mapping, walked as
deepseek_v2's load_weights walks it) to FusedMoE.weight_loader with an expert id and a
shard id (w1 gate, w3 up, w2 down). For every tensor-parallel rank (rank and size patched
in) the layer is a real FusedMoE built with vLLM's GGUF quantization config. Then:

- weights: each expert slot of w13_qweight and w2_qweight, dequantized by gguf-py, must
  equal the file's expert of the same id, gate and up cut on their rows for the rank, down
  on its inputs (exact: the same bytes). An expert one slot off, gate and up swapped, or
  "10" sorted before "2" names the slot and the expert it holds.
- output: the layer's GGUF MoE method applied to random tokens with a routing that picks
  known experts (every expert, each token two of them with fixed weights) against
  sum_k w_k * down_e(silu(gate_e x) * up_e x) from the file's dequantized experts.

On a GPU the output runs vLLM's GGUF MoE kernels (ggml_moe_a8_vec for few tokens,
ggml_moe_a8 past 64); without one (CI) cpu_reference_moe, a gguf-py dequantization of
the layer's own loaded weights, stands in for the kernel, so the output check then covers
the layer's hand-over to the kernel (types, activation, expert ids) and not the kernel.
Experts stored unquantized (F32/F16/BF16, patch 0006's path) are not covered here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from glm5_tools.diagnostics.gguf_io import FLOAT_TYPES, GGUFTensor, block_info
from glm5_tools.diagnostics.patching import replaced

PROJS = (("gate", "w1"), ("up", "w3"), ("down", "w2"))  # GGUF ffn_*_exps, vLLM shard id
# The weights are the file's bytes moved, never recomputed: any difference is a fault.
TOLERANCE_WEIGHTS = 0.0
# Output, max |moe(x) - reference| / max |reference| per layer, rank and token count.
# CPU: float32 products summed in another order (measured < 1e-6 on the synthetic model).
# GPU: q8_1 activations twice (before w13 and before w2) and bfloat16 inputs; not yet
# measured on the GPU machine (set from stage 4's linear tolerance, two matmuls deep).
TOLERANCE_CPU = 1e-4
TOLERANCE_GPU = 6e-2
TOKENS = (3, 80)  # 3: the vector kernel (ggml_moe_a8_vec); 80 (> 64): the batched one
TOP_K = 2
SLOTS_SHOWN = 3  # wrong slots named per parameter, rank and layer (the rest counted)

# (x, w13 [E, 2I, bytes], w2 [E, H, bytes], topk_weights, topk_ids, w13 type, w2 type,
#  activation) -> [tokens, H]
MoEKernel = Callable[..., torch.Tensor]


def _dequant(raw: np.ndarray, qtype: int) -> torch.Tensor:
    import gguf

    flat = np.ascontiguousarray(raw.reshape(-1, raw.shape[-1]))
    out = gguf.quants.dequantize(flat, gguf.GGMLQuantizationType(qtype))
    return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(*raw.shape[:-1], -1))


def cpu_reference_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, qtype1: int, qtype2: int, activation: str) -> torch.Tensor:
    """Stands in for vLLM's GGUF MoE kernel where there is no GPU: the layer's loaded
    w13/w2 dequantized by gguf-py, silu(gate) * up, down, weighted sum over the top k."""
    if activation != "silu":
        raise ValueError(f"cpu_reference_moe: activation {activation!r}, GLM-5 uses silu")
    w13 = _dequant(w1.cpu().numpy(), qtype1)
    down = _dequant(w2.cpu().numpy(), qtype2)
    return reference_output(x.float().cpu(), topk_weights, topk_ids, w13, down).to(x.dtype)


@dataclass
class MoESpec:
    layer: int
    parts: dict[str, GGUFTensor]  # gate / up / down -> ffn_*_exps, in the file's order

    @property
    def experts(self) -> int:
        return self.parts["gate"].shape[0]

    @property
    def label(self) -> str:
        return f"blk.{self.layer} mlp.experts"


def moe_specs(tensors: dict[str, GGUFTensor], layers: list[int]) -> list[MoESpec]:
    order = {name: i for i, name in enumerate(tensors)}
    specs = []
    for i in layers:
        names = {p: f"blk.{i}.ffn_{p}_exps.weight" for p, _ in PROJS}
        if all(n in tensors for n in names.values()):
            parts = dict(sorted(((p, tensors[n]) for p, n in names.items()), key=lambda kv: order[kv[1].name]))
            specs.append(MoESpec(i, parts))
    return specs


@contextmanager
def _tp_rank_as(rank: int) -> Iterator[None]:
    """FusedMoE takes its size as an argument but asks the TP group for its rank."""
    import vllm.model_executor.layers.fused_moe.config as moe_config

    with replaced(moe_config, get_tensor_model_parallel_rank=lambda: rank):
        yield


@contextmanager
def moe_kernel(kernel: MoEKernel | None) -> Iterator[None]:
    """Put kernel in place of vLLM's fused_moe_gguf for the check (None: vLLM's own)."""
    import vllm.model_executor.layers.quantization.gguf as vllm_gguf

    with replaced(vllm_gguf, fused_moe_gguf=kernel):
        yield


def loader_items(spec: MoESpec) -> list[tuple[str, torch.Tensor]]:
    """What vLLM's GGUF weight iterator yields for the layer's experts: every type first,
    then the data, each merged tensor under expert 0's HF name."""
    base = f"model.layers.{spec.layer}.mlp.experts.0"
    types = [(f"{base}.{p}_proj.qweight_type", torch.tensor(t.qtype)) for p, t in spec.parts.items()]
    data = [(f"{base}.{p}_proj.qweight", torch.from_numpy(np.array(t.raw))) for p, t in spec.parts.items()]
    return types + data


def build_layer(spec: MoESpec, rank: int, tp: int) -> torch.nn.Module:
    """The layer as deepseek_v2 builds it, loaded as its load_weights loads it."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE
    from vllm.model_executor.layers.quantization.gguf import GGUFConfig

    e, inter, hidden = spec.parts["gate"].shape
    prefix = f"model.layers.{spec.layer}.mlp.experts"
    context = get_current_vllm_config().compilation_config.static_forward_context
    with _tp_rank_as(rank):
        layer = FusedMoE(num_experts=e, top_k=TOP_K, hidden_size=hidden, intermediate_size=inter,
                         params_dtype=torch.float32, quant_config=GGUFConfig(), tp_size=tp,
                         dp_size=1, pcp_size=1, prefix=prefix)
    context.pop(prefix, None)
    if layer.tp_rank != rank or layer.tp_size != tp:
        raise RuntimeError(f"FusedMoE took rank {layer.tp_rank}/{layer.tp_size}, not {rank}/{tp}")
    mapping = FusedMoE.make_expert_params_mapping(layer, ckpt_gate_proj_name="gate_proj",
                                                  ckpt_down_proj_name="down_proj",
                                                  ckpt_up_proj_name="up_proj", num_experts=e)
    params = {f"{prefix}.{n}": p for n, p in layer.named_parameters()}
    for name, data in loader_items(spec):
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in name:
                continue
            target = name.replace(weight_name, param_name)
            param = params[target]
            if param.weight_loader(param, data, target, shard_id=shard_id, expert_id=expert_id,
                                   return_success=True):
                break
        else:
            raise RuntimeError(f"{name}: no expert mapping of the layer took it")
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def expected_experts(spec: MoESpec, rank: int, tp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, 2I/tp, H] gate and up, [E, H, I/tp] down for the rank, from the file."""
    full = {p: _dequant(np.asarray(t.raw), t.qtype) for p, t in spec.parts.items()}
    w13 = torch.cat([full["gate"].chunk(tp, dim=1)[rank], full["up"].chunk(tp, dim=1)[rank]], dim=1)
    return w13, full["down"].chunk(tp, dim=2)[rank]


def _split_inside_block(spec: MoESpec, tp: int) -> str:
    down = spec.parts["down"]
    block, _ = block_info(down.qtype)
    per_rank = down.shape[2] // tp
    if tp == 1 or per_rank % block == 0:
        return ""
    return (f"ffn_down_exps: {down.shape[2]} inputs over {tp} ranks is {per_rank} per rank, inside "
            f"{down.type_name}'s {block}-value blocks: vLLM's GGUF loader cannot shard it at this size")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _slots(got: torch.Tensor, want: torch.Tensor, what: str) -> list[str]:
    """Per expert slot that differs: which file expert (if any) it holds."""
    out = []
    for slot in range(got.shape[0]):
        if torch.equal(got[slot], want[slot]):
            continue
        holds = [e for e in range(want.shape[0]) if torch.equal(got[slot], want[e])]
        hint = f"holds expert {holds[0]}" if holds else "matches no expert of the file"
        out.append(f"{what} slot {slot} {hint}")
    return out


def check_weights(layer: torch.nn.Module, spec: MoESpec, rank: int, tp: int) -> tuple[float, list[str]]:
    want13, want2 = expected_experts(spec, rank, tp)
    got13 = _dequant(layer.w13_qweight.data.cpu().numpy(), int(layer.w13_qweight_type.weight_type))
    got2 = _dequant(layer.w2_qweight.data.cpu().numpy(), int(layer.w2_qweight_type.weight_type))
    problems = []
    worst = 0.0
    for what, got, want in (("w13", got13, want13), ("w2", got2, want2)):
        if got.shape != want.shape:
            problems.append(f"{what} shape {list(got.shape)} != {list(want.shape)}")
            worst = math.inf
            continue
        half = want.shape[1] // 2
        if what == "w13" and not torch.equal(got, want) and torch.equal(
                torch.cat([got[:, half:], got[:, :half]], dim=1), want):
            problems.append("w13: gate (w1) and up (w3) swapped in every expert")
        else:
            slots = _slots(got, want, what)
            problems.extend(slots[:SLOTS_SHOWN])
            if len(slots) > SLOTS_SHOWN:
                problems.append(f"{what}: {len(slots) - SLOTS_SHOWN} more slots differ")
        worst = max(worst, _rel(got, want))
    return worst, problems


def routing(tokens: int, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token t picks experts t and t + 1 + t // E (mod E): every expert, two distinct ones a
    token, with unequal weights so that a swapped pair shows too."""
    ids = torch.tensor([[t % experts, (t + 1 + t // experts) % experts] for t in range(tokens)],
                       dtype=torch.int32)
    weights = torch.tensor([[0.7, 0.3]] * tokens, dtype=torch.float32)
    return weights, ids


def reference_output(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     w13: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    half = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], down.shape[1])
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            h = w13[e] @ x[t]
            out[t] += w * (down[e] @ (torch.nn.functional.silu(h[:half]) * h[half:]))
    return out


def check_experts(
    tensors: dict[str, GGUFTensor],
    layers: list[int],
    tp: int,
    device: str,
    kernel: MoEKernel | None,
    gen: torch.Generator,
) -> tuple[float, float, list[str], list[str], int]:
    """(worst weight error, worst output error, problems, checked lines, layers found);
    kernel None: vLLM's own (GPU)."""
    on_gpu = device != "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    problems: list[str] = []
    checked: list[str] = []
    worst_w = worst_out = 0.0
    specs = moe_specs(tensors, layers)
    for spec in specs:
        types = "+".join(f"{p}:{t.type_name}" for p, t in spec.parts.items())
        if any(t.qtype in FLOAT_TYPES for t in spec.parts.values()):
            checked.append(f"{spec.label} ({types}): unquantized experts, not covered by this check")
            continue
        label_w = label_out = 0.0
        split = _split_inside_block(spec, tp)
        ranks = [] if split else list(range(tp))
        if split:
            problems.append(f"{spec.label}: {split}")
            label_w = label_out = math.inf
        for rank in ranks:
            try:
                layer = build_layer(spec, rank, tp)
            except (RuntimeError, ValueError, AssertionError, KeyError) as exc:
                problems.append(f"{spec.label} rank {rank}: vLLM could not load it: {exc}"[:300])
                label_w = label_out = math.inf
                continue
            err, bad = check_weights(layer, spec, rank, tp)
            problems.extend(f"{spec.label} rank {rank}: {b}" for b in bad)
            label_w = max(label_w, err)
            want13, want2 = expected_experts(spec, rank, tp)
            layer = layer.to(device)
            for n in TOKENS:
                weights, ids = routing(n, spec.experts)
                x = torch.randn(n, want13.shape[2], generator=gen).to(device, dtype)
                try:
                    got = layer.quant_method.apply(layer, x, weights.to(device), ids.to(device),
                                                   None).float().cpu()
                except (RuntimeError, ValueError, NotImplementedError) as exc:
                    problems.append(f"{spec.label} rank {rank} tokens {n}: {exc}"[:300])
                    label_out = math.inf
                    continue
                want = reference_output(x.float().cpu(), weights, ids, want13, want2)
                out_err = _rel(got, want) if got.shape == want.shape else math.inf
                tolerance = TOLERANCE_GPU if on_gpu else TOLERANCE_CPU
                if not out_err <= tolerance:
                    problems.append(f"{spec.label} rank {rank} tokens {n}: output rel err {out_err:.3e}")
                label_out = out_err if math.isnan(out_err) else max(label_out, out_err)
        worst_w = max(worst_w, label_w)
        worst_out = label_out if math.isnan(label_out) else max(worst_out, label_out)
        checked.append(f"{spec.label} ({spec.experts} experts, {types}, {len(ranks)} rank(s)): "
                       f"weights max rel err {label_w:.3e}, output max rel err {label_out:.3e}")
    return worst_w, worst_out, problems, checked, len(specs)

