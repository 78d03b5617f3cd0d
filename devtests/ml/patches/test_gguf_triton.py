"""Patches 0014/0015: GGUF weight kernels chosen by measurement, and the project's own in Triton.

gguf_triton_check.py runs 0015's kernels in Triton's CPU interpreter against a float32
matmul of gguf-py's dequantized weights (gguf-py is an implementation independent of the
kernels: llama.cpp's own Python package). Every type and form the dispatch can pick is
exact to float32 rounding with float32 activations (the kernels dequantize with ggml's
arithmetic and accumulate in float32); with fp16/bf16 activations the bound is the
activations' own rounding. Faults placed in the kernels (faults/gguf-*.patch: a sub-block
scale's high bits, the sign of a min, Q6_K's high bits, the expert a pair reads) fail the
cases that take the faulted code, by name. The rest checks gguf.py's dispatch: the modes
of GLM5_GGUF_KERNELS, an unknown one refused at import, the CPU path left to vLLM's ops
(which the CPU whole-model check replaces), and a type the kernels do not cover named at
load. On the GPU: docs/validation/gguf-kernels.md (real shapes, timings).
"""

from __future__ import annotations

import ast
from pathlib import Path

import overlay
import pytest

HERE = Path(__file__).resolve().parent
FAULTS = HERE / "faults"
# float32 activations: float32 rounding of sums of ~10^3 products; fp16/bf16
# activations and outputs: their own rounding (2^-11, 2^-8)
BOUND_F32 = 1e-5
BOUND = {"dense Q4_K dot fp16": 2e-3, "dense Q6_K fma256 bf16": 1e-2,
         **{f"dense {t} dotq fp16": 2e-3 for t in ("Q4_K", "Q5_K", "Q6_K", "Q8_0")}}


def run_check(site: Path, *cases: str) -> dict[str, float]:
    result = overlay.run_interpreted(site, "gguf_triton_check.py", *cases)
    return {str(k): float(v) for k, v in result.items()}


def test_every_type_and_form_equals_float32() -> None:
    import conftest

    errors = run_check(conftest.PATCHED_SITE)
    assert len(errors) == 38
    for types in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        assert {f"dense {types} fma256", f"dense {types} fma32 split", f"dense {types} dot",
                f"dense {types} dotq"} <= set(errors)
    bad = {k: v for k, v in errors.items() if not v <= BOUND.get(k, BOUND_F32)}
    assert not bad, bad
    # the low-precision cases are not exact: the bound is theirs, not a float32 one met by luck
    assert errors["dense Q4_K dot fp16"] > BOUND_F32
    assert errors["dense Q6_K fma256 bf16"] > BOUND_F32


@pytest.mark.parametrize(
    ("fault", "cases"),
    [
        ("gguf-sub-block-scale.patch", ["dense Q4_K fma256", "dense Q5_K dot", "dense Q5_K fma32 split",
                                        "dense Q4_K dotq"]),
        ("gguf-min-sign.patch", ["dense Q4_K fma256", "dense Q5_K fma256 split", "dense Q4_K dotq",
                                 "moe Q4_K/Q5_K dotq"]),
        ("gguf-q6k-high-bits.patch", ["dense Q6_K dot", "dense Q6_K fma32 split", "dense Q6_K fma256",
                                      "dense Q6_K dotq"]),
        ("gguf-expert-index.patch", ["moe Q4_K/Q5_K fma256 split"]),
    ],
)
def test_a_fault_in_the_kernels_fails_the_check(tmp_path: Path, fault: str, cases: list[str]) -> None:
    site = overlay.make_overlay(tmp_path / "site", [*overlay.patches(), FAULTS / fault])
    errors = run_check(site, *cases)
    assert set(errors) == set(cases)
    wrong = {k: v for k, v in errors.items() if v > 100 * BOUND_F32}
    assert wrong == errors, f"{fault}: not every case that takes the faulted code failed: {errors}"


def test_modes_and_refusal(tmp_path: Path) -> None:
    """GLM5_GGUF_KERNELS: triton by default, tuned and vllm accepted, anything else
    stops vLLM at import naming the variable; without 0015 triton is unknown and
    tuned the default."""
    import conftest

    code = (
        "import vllm.model_executor.layers.quantization.gguf as g;"
        "print('MODE', g.GGUF_KERNELS)"
    )
    for env, want in ((None, "triton"), ("tuned", "tuned"), ("vllm", "vllm")):
        proc = overlay.run_in(conftest.PATCHED_SITE, _with_env(code, env))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert _mode(proc.stdout) == want
    proc = overlay.run_in(conftest.PATCHED_SITE, _with_env(code, "fast"))
    assert proc.returncode != 0
    assert "GLM5_GGUF_KERNELS='fast' is not one of vllm, tuned, triton" in proc.stderr
    only14 = overlay.make_overlay(tmp_path / "upto0014", [p for p in overlay.patches() if p.name < "0015"])
    proc = overlay.run_in(only14, _with_env(code, "triton"))
    assert "GLM5_GGUF_KERNELS='triton' is not one of vllm, tuned" in proc.stderr
    proc = overlay.run_in(only14, _with_env(code, None))
    assert _mode(proc.stdout) == "tuned"


def _mode(stdout: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("MODE "))


def _with_env(code: str, value: str | None) -> str:
    key = "'GLM5_GGUF_KERNELS'"
    set_env = f"os.environ.pop({key}, None)" if value is None else f"os.environ[{key}] = {value!r}"
    return f"import os; {set_env}; {code}"


def test_cpu_tensors_keep_vllms_ops_and_uncovered_types_are_named() -> None:
    """triton mode: on CPU tensors the Triton path is never taken (the CPU whole-model
    check replaces vLLM's ops there); an IQ type is named at load, a covered or float
    type is not."""
    import conftest

    code = """
import logging, os, torch
os.environ["GLM5_GGUF_KERNELS"] = "triton"
import vllm.model_executor.layers.quantization.gguf as g
assert g._triton_covers(torch.empty(1, 256), 12) is False
# the measured ranges: Q6_K dense layers at 1-2 tokens, the Q6_K head at 4-64,
# Q5_K never, the routed experts at 1-2 and from 256
assert g.triton_dense_tokens(14, 576) == (1, 2) and g.triton_dense_tokens(14, 6144) == (1, 2)
assert g.triton_dense_tokens(14, 19360) == (4, 64)
assert g.triton_dense_tokens(13, 2048) == (1, 0) and g.triton_dense_tokens(13, 19360) == (1, 0)
assert g.triton_dense_tokens(12, 2048) == (1, 0)
assert g.TRITON_MOE_TOKENS == ((1, 2), (256, 1 << 30))
records = []
class H(logging.Handler):
    def emit(self, r): records.append(r.getMessage())
g.logger.addHandler(H())
g._warn_uncovered("model.layers.3.mlp.experts", [12, 13])
g._warn_uncovered("model.layers.0.self_attn.fused_qkv_a_proj", [13, 30])
g._warn_uncovered("model.layers.9.self_attn.q_b_proj", [16])
print(repr(records))
"""
    proc = overlay.run_in(conftest.PATCHED_SITE, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert records == [
        "GGUF: model.layers.9.self_attn.q_b_proj is IQ2_XXS, which the Triton kernels do not cover: "
        "it runs on vLLM's GGUF kernels"
    ]
