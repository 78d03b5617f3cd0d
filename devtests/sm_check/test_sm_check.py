"""The pure parts of glm5_tools.sm_check: SASS scan, verdicts, overrides, names.

The ahead-of-time compile itself needs Triton (the ml venv): devtests/ml/patches/test_sm120_kernels.py.
"""

from __future__ import annotations

import pytest

from glm5_tools.sm_check.__main__ import apply_overrides
from glm5_tools.sm_check.compile import KernelResult, scan_sass
from glm5_tools.sm_check.libs import base_name
from glm5_tools.sm_check.report import markdown, problems, warnings
from glm5_tools.sm_check.targets import HOPPER_ONLY_SASS, target
from glm5_tools.sm_check.trace import ArgSpec, LaunchRecord, unreached

SM120 = target("sm_120")
SM90 = target("sm_90")

SASS = """
        /*0110*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;     /* 0x0000000c0804723c */
        /*0120*/              @!P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R6.64] ;
        /*0130*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ; /* 0x0 */
        /*0140*/                   UTMALDG.2D.MULTICAST [UR8], [UR4] ;
"""


def result(**kw: object) -> KernelResult:
    base = dict(kernel="m:_k", scenario="s", target="sm_120", launch="BLOCK=32 num_warps=4", num_warps=4)
    base.update(kw)
    return KernelResult(**base)  # type: ignore[arg-type]


def test_scan_sass_finds_hopper_only_instructions_and_mma_kinds() -> None:
    found, mma = scan_sass(SASS, HOPPER_ONLY_SASS)
    assert found == ["HGMMA.64x64x16.F32.BF16", "UTMALDG.2D.MULTICAST"]
    assert mma == ["HGMMA", "HMMA"]
    assert scan_sass(SASS, ()) == ([], ["HGMMA", "HMMA"])


def test_verdicts_name_kernel_need_and_limit() -> None:
    assert problems(result(shared=101376, regs=255), SM120) == []
    (smem,) = problems(result(shared=101377, regs=128), SM120)
    assert smem == (
        "_k [BLOCK=32 num_warps=4] on sm_120: needs 101377 bytes of shared memory per block, sm_120 allows 101376"
    )
    assert problems(result(shared=101377, regs=128, target="sm_90"), SM90) == []
    (regs,) = problems(result(shared=0, regs=255, num_warps=16), SM120)
    assert "255 registers x 512 threads = 130560 > 65536" in regs
    spilling = result(shared=0, regs=255, spill_stores=8, spill_loads=8)
    assert problems(spilling, SM120) == []  # runs, slower: a warning
    (spill,) = warnings(spilling, SM120)
    assert "spills registers (8 bytes stored, 8 bytes loaded)" in spill
    assert problems(spilling, SM120, spills_fail=True) == [spill]
    (sass,) = problems(result(shared=0, regs=40, forbidden=["HGMMA.64x64x16.F32.BF16"]), SM120)
    assert "SASS has HGMMA.64x64x16.F32.BF16, not for sm_120" in sass
    (err,) = problems(result(error="PTXASError: ptxas failed"), SM120)
    assert "does not compile: PTXASError" in err


def test_markdown_marks_failures_per_target() -> None:
    text = markdown([result(shared=120000, regs=100), result(shared=120000, regs=100, target="sm_90")], [SM120, SM90])
    assert "FAIL (1)" in text
    assert "sm_120 FAIL: _k [BLOCK=32 num_warps=4] on sm_120: needs 120000 bytes" in text
    assert "sm_90 ok" in text


def test_override_sets_launch_values_and_refuses_unknown_kernels() -> None:
    rec = LaunchRecord("m:_k", "s", [], {"BLOCK_N": ArgSpec("int", 32), "num_stages": ArgSpec("int", 1)})
    assert apply_overrides([rec], ["_k:num_stages=2,BLOCK_N=128"]) == 1
    assert rec.constexpr_kwargs() == {"BLOCK_N": 128} and rec.launch_options() == {"num_stages": 2}
    with pytest.raises(SystemExit, match="no launch of _other"):
        apply_overrides([rec], ["_other:num_stages=2"])
    with pytest.raises(SystemExit, match="expected KERNEL:NAME=VALUE"):
        apply_overrides([rec], ["_k"])


def test_unknown_target_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown target 'sm_89': one of sm_100, sm_120, sm_90"):
        target("sm_89")


def test_base_name_strips_templates_and_arguments() -> None:
    assert base_name("void vllm::rms_norm_kernel<c10::Half, 8>(c10::Half*, int)") == "vllm::rms_norm_kernel"
    assert base_name("void dequantize_block<32, 2, &ns::f, float>(void const*, float*, int)") == "dequantize_block"


def test_unreached_follows_helpers_called_from_helpers() -> None:
    """A kernel counts when launched; a @triton.jit helper when a launched kernel calls
    it, directly or through other helpers; anything else is named."""
    defined = [
        ("_kernel", "m:_kernel", "def _kernel(x):\n    _rows(x)"),
        ("_rows", "m:_rows", "def _rows(x):\n    return _scale(x)"),
        ("_scale", "m:_scale", "def _scale(x):\n    return x"),
        ("_other_kernel", "m:_other_kernel", "def _other_kernel(x):\n    _unused_helper(x)"),
        ("_unused_helper", "m:_unused_helper", "def _unused_helper(x):\n    return x"),
    ]
    launched = {"m:_kernel"}
    assert unreached(launched, [defined[0][2]], defined) == ["m:_other_kernel", "m:_unused_helper"]
    # without the helper chain only the direct callee would count
    assert unreached(launched, [defined[0][2]], defined[:2]) == []
    assert unreached(set(), [], defined[:1]) == ["m:_kernel"]
