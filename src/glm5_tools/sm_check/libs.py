"""Which SASS a compiled library holds for a target, and which kernels back each op.

``archs(lib)`` lists the architectures of the ELF (SASS) images in a shared
library (``cuobjdump --list-elf``) and ``ptx_archs`` those of its PTX;
``entry_kernels(lib, arch)`` the kernel entry points of one architecture
(``cuobjdump -symbols``, STO_ENTRY symbols), demangled with c++filt.

``serving_ops(vllm_root)`` lists the compiled-library ops the serving path calls:
the call sites in GLM-5's serving modules (``SERVING_MODULES``) that go through
``vllm._custom_ops`` (``ops.<wrapper>(``) or straight through
``torch.ops.<namespace>.<op>``, the wrappers resolved to the ``torch.ops`` ops
their bodies call. ``OP_KERNELS`` names the kernels behind each op (read from
vLLM 0.20.2's csrc: the __global__ functions each op's host code launches);
an op on the path that has no entry there is reported as unmapped.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .compile import tool

# GLM-5 GGUF on TRITON_MLA_SPARSE (or TRITON_MLA): the model, its layers, the
# GGUF linear and MoE method, the MoE router and alignment, the attention layer
# and backends, the indexer, vLLM's top-k ops.
SERVING_MODULES: tuple[str, ...] = (
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/model_executor/layers/quantization/gguf.py",
    "vllm/model_executor/layers/layernorm.py",
    "vllm/model_executor/layers/activation.py",
    "vllm/model_executor/layers/rotary_embedding/base.py",
    "vllm/model_executor/layers/rotary_embedding/common.py",
    "vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py",
    "vllm/model_executor/layers/fused_moe/moe_align_block_size.py",
    "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py",
    "vllm/model_executor/layers/fused_moe/router/fused_topk_router.py",
    "vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py",
    "vllm/model_executor/layers/attention/mla_attention.py",
    "vllm/model_executor/layers/sparse_attn_indexer.py",
    "vllm/v1/attention/backends/mla/triton_mla.py",
    "vllm/v1/attention/backends/mla/sparse_utils.py",
    "vllm/v1/attention/backends/mla/indexer.py",
    "vllm/v1/attention/ops/merge_attn_states.py",
)

# op -> regex over demangled kernel names (without "void " and arguments)
OP_KERNELS: dict[str, str] = {
    "rms_norm": r"^vllm::rms_norm_kernel$",
    "fused_add_rms_norm": r"^vllm::(fused_add_rms_norm_kernel|rms_norm_kernel)$",
    "silu_and_mul": r"^vllm::act_and_mul_kernel$",
    "rotary_embedding": r"^vllm::rotary_embedding_kernel$",
    "ggml_dequantize": r"^dequantize_block",
    "ggml_mul_mat_vec_a8": r"^mul_mat_vec_q$",
    "ggml_mul_mat_a8": r"^mul_mat_q\d",
    "ggml_moe_a8": r"^moe_q\d",
    "ggml_moe_a8_vec": r"^moe_vec_q$",
    "moe_align_block_size": (
        r"^vllm::moe::(moe_align_block_size|moe_align_block_size_small_batch_expert|count_and_sort_expert_tokens)_kernel$"
    ),
    "moe_sum": r"^vllm::moe::moe_sum_kernel$",
    "grouped_topk": r"^vllm::moe::grouped_topk_fused",
    "topk_softmax": r"^vllm::moe::(topkGating|moeSoftmax|moeTopK)",
    "topk_sigmoid": r"^vllm::moe::(topkGating|moeSigmoid|moeTopK)",
    "concat_and_cache_mla": r"^vllm::concat_and_cache_mla_kernel$",
    "concat_and_cache_mla_rope_fused": r"^vllm::concat_and_cache_mla_rope_fused_kernel$",
    "indexer_k_quant_and_cache": r"^vllm::indexer_k_quant_and_cache_kernel$",
    "cp_gather_indexer_k_quant_cache": r"^vllm::cp_gather_indexer_k_quant_cache_kernel$",
    "gather_and_maybe_dequant_cache": r"^vllm::gather_and_maybe_dequant_cache$",
    "per_token_group_fp8_quant": r"^per_token_group_quant_8bit_kernel$",
    "top_k_per_row_decode": r"^vllm::topKPerRowDecode$",
    "top_k_per_row_prefill": r"^vllm::topKPerRowPrefill$",
    "persistent_topk": r"^vllm::persistent::persistent_topk_kernel$",
    "concat_mla_q": r"^vllm::ConcatMLAQKernel$",
    "merge_attn_states": r"merge_attn_states_kernel$",
}

# ops that answer a question on the host (a capability, a size) and launch no kernel:
# a trace that calls them needs nothing of the libraries' SASS
HOST_QUERY_OPS: frozenset[str] = frozenset(
    {"_C.cutlass_scaled_mm_supports_fp8", "_C.cutlass_scaled_mm_supports_block_fp8"}
)

LIBRARIES: tuple[str, ...] = ("_C.abi3.so", "_moe_C.abi3.so", "_C_stable_libtorch.abi3.so")

_ARCH = re.compile(r"\.(sm_\d+[a-z]?)\.")
_WRAPPER_CALL = re.compile(r"\bops\.(\w+)\(")
_TORCH_OP = re.compile(r"torch\.ops\.(_C|_moe_C|_C_cache_ops|_C_custom_ar)\.(\w+)")


def archs(lib: Path, kind: str = "elf") -> set[str]:
    out = subprocess.run(
        [str(tool("cuobjdump")), f"--list-{kind}", str(lib)], capture_output=True, text=True, check=False
    ).stdout
    return set(_ARCH.findall(out))


def entry_kernels(lib: Path, arch: str) -> list[str]:
    out = subprocess.run(
        [str(tool("cuobjdump")), "-symbols", "-arch", arch, str(lib)], capture_output=True, text=True, check=False
    ).stdout
    mangled = sorted({line.split()[-1] for line in out.splitlines() if "STO_ENTRY" in line})
    demangler = shutil.which("cu++filt") or shutil.which("c++filt")
    if demangler is None or not mangled:
        return mangled
    names = subprocess.run([demangler], input="\n".join(mangled), capture_output=True, text=True, check=True).stdout
    return [base_name(n) for n in names.splitlines()]


def base_name(demangled: str) -> str:
    """'void ns::kernel<T, 4>(args)' -> 'ns::kernel'."""
    name = demangled.removeprefix("void ")
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()


def wrapper_ops(custom_ops: Path) -> dict[str, set[str]]:
    """vllm._custom_ops function -> torch.ops 'namespace.op' its body calls."""
    tree = ast.parse(custom_ops.read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            src = ast.get_source_segment(custom_ops.read_text(encoding="utf-8"), node) or ""
            found[node.name] = {f"{ns}.{op}" for ns, op in _TORCH_OP.findall(src)}
    return found


@dataclass
class OpUse:
    op: str  # namespace.op
    callers: set[str] = field(default_factory=set)


def serving_ops(vllm_root: Path, modules: tuple[str, ...] = SERVING_MODULES) -> dict[str, OpUse]:
    """Compiled-library ops called from the serving modules (vllm_root: the dir holding vllm/)."""
    wrappers = wrapper_ops(vllm_root / "vllm" / "_custom_ops.py")
    uses: dict[str, OpUse] = {}
    for rel in modules:
        path = vllm_root / rel
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        ops = {f"{ns}.{op}" for ns, op in _TORCH_OP.findall(text)}
        if "_custom_ops as ops" in text:
            for fn in _WRAPPER_CALL.findall(text):
                ops |= wrappers.get(fn, set())
        for op in ops:
            uses.setdefault(op, OpUse(op)).callers.add(rel.removeprefix("vllm/"))
    return uses


@dataclass
class OpResult:
    op: str
    callers: list[str]
    pattern: str | None
    kernels: dict[str, list[str]]  # library -> matching sm kernels
    library_archs: dict[str, list[str]]

    @property
    def ok(self) -> bool:
        return self.pattern is not None and any(self.kernels.values())


def check_ops(vllm_root: Path, arch: str, uses: dict[str, OpUse]) -> list[OpResult]:
    libs = {name: vllm_root / "vllm" / name for name in LIBRARIES if (vllm_root / "vllm" / name).exists()}
    kernels = {name: entry_kernels(path, arch) for name, path in libs.items()}
    lib_archs = {name: sorted(archs(path)) for name, path in libs.items()}
    out = []
    for op in sorted(uses):
        short = op.split(".", 1)[1]
        pattern = OP_KERNELS.get(short)
        hits: dict[str, list[str]] = {}
        if pattern is not None:
            rx = re.compile(pattern)
            for name, names in kernels.items():
                matched = sorted({k for k in names if rx.search(k)})
                if matched:
                    hits[name] = matched
        out.append(OpResult(op, sorted(uses[op].callers), pattern, hits, lib_archs))
    return out
