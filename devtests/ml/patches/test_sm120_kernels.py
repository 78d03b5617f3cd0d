"""Every Triton kernel of the serving path compiled for SM 12.0 on the CPU.

glm5_tools.sm_check traces vLLM's launch sites on the patched overlay under a
virtual RTX PRO 6000 (compute capability 12.0, 188 SMs), records every JITFunction
launch at GLM-5's per-rank shapes for TP 1/2/4/8, and compiles each for sm_120 with the
ptxas Triton ships: shared memory per block against 101376 bytes (sm_120's opt-in
limit), registers, spills, SASS.
Every kernel a patch of the set adds (a '+@triton.jit' line) must be launched by
some scenario. The oversized-configuration fault shows the check can fail. sm_90 (the
H100/H200 of the GPU runs, which compile every kernel they launch anyway) is left to
`--target sm_90` on demand: a second trace and compile would add minutes to every CI run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import overlay
import warm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# compiled results, keyed by Triton's version, each kernel's source hash, its
# specialization and the target: only kernels whose source or launch changed recompile
CACHE = Path(os.environ.get("GLM5_SM_CHECK_CACHE", ROOT / ".cache" / "sm_check"))


def patch_kernel_modules() -> list[str]:
    """Modules in which a patch of the set defines a Triton kernel."""
    modules = set()
    for patch in overlay.patches():
        for section in re.split(r"^--- ", patch.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
            target = re.search(r"^\+\+\+ [^/\s]+/(\S+)\.py", section, re.MULTILINE)
            if target and re.search(r"^\+\s*@triton\.jit", section, re.MULTILINE):
                modules.add(target.group(1).replace("/", "."))
    return sorted(modules)


def sm_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    import conftest

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="ERROR")
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(conftest.PATCHED_SITE), str(ROOT / "src")])
    out = tmp_path / "sm_check.json"
    proc = warm.run([sys.executable, "-m", "glm5_tools.sm_check", "--json", str(out), "--cache", str(CACHE), *args],
                    env=env, timeout=1800)
    report = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    return proc, report


def test_patch_set_defines_kernels() -> None:
    assert "vllm.v1.attention.backends.mla.sparse_utils" in patch_kernel_modules()


def test_every_serving_path_kernel_fits_sm120(tmp_path: Path) -> None:
    import conftest

    required = [a for m in patch_kernel_modules() for a in ("--require-traced", m)]
    required += ["--libs", str(conftest.PATCHED_SITE)]
    proc, report = sm_check(
        tmp_path,
        "--target",
        "sm_120",
        "--jobs",
        "2",
        "--markdown",
        str(tmp_path / "t.md"),
        *required,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert report["failures"] == []
    # register spills are warnings (the kernel runs, slower): vLLM's sampler top-k/top-p
    # spills (on sm_90 as much); of the patch set's kernels only three GGUF
    # configurations spill, a few bytes (docs/validation/sm120.md); more is a regression
    traces = report["traces"]
    spills: dict[str, int] = {}
    for r in traces["sm_120"]["results"]:
        if r["spill_stores"] or r["spill_loads"]:
            name = r["kernel"].rsplit(":", 1)[-1]
            spills[name] = max(spills.get(name, 0), r["spill_stores"])
    allowed = {"_topk_topp_kernel", "_dense_dot_kernel", "_moe_down_fma_kernel", "_moe_down_dot_kernel"}
    assert set(spills) <= allowed, report["warnings"]
    small = {k: v for k, v in spills.items() if k != "_topk_topp_kernel"}
    assert all(v <= 16 for v in small.values()), small
    for target in ("sm_120",):
        results = traces[target]["results"]
        assert results and all(not r["error"] and r["regs"] > 0 for r in results)
        kernels = {r["kernel"].split(":")[0] for r in results}
        # the sparse backend's kernels and TRITON_MLA's decode kernels were reached
        assert "vllm.v1.attention.backends.mla.sparse_utils" in kernels
        assert "vllm.v1.attention.ops.triton_decode_attention" in kernels
    sm120 = [r for r in traces["sm_120"]["results"] if r["target"] == "sm_120"]
    assert max(r["shared"] for r in sm120) <= 101376
    assert all(not r["forbidden"] for r in sm120)
    # each TP's query heads per rank reached the dense decode kernel
    groups = {
        rec["kwargs"]["kv_group_num"]["value"]
        for rec in traces["sm_120"]["records"]
        if rec["kernel"].endswith(":_fwd_grouped_kernel_stage1")
    }
    assert groups == {64, 32, 16, 8}
    # the compiled-library ops the traced code called are listed, and every mapped
    # op the serving modules call has sm_120 kernels in the wheel
    assert traces["sm_120"]["ops"]
    libs = report["libraries"]
    assert "sm_120" in libs["archs"]["_C.abi3.so"] and "sm_120" in libs["archs"]["_moe_C.abi3.so"]
    from glm5_tools.sm_check.libs import HOST_QUERY_OPS

    for op in traces["sm_120"]["ops"]:
        if op not in HOST_QUERY_OPS:
            assert libs["ops"][op]["sm_120"], op
    for op in ("_C.ggml_dequantize", "_C.ggml_mul_mat_vec_a8", "_C.ggml_moe_a8", "_C.rms_norm", "_moe_C.grouped_topk"):
        assert libs["ops"][op]["sm_120"], op


def test_oversized_configuration_fails_naming_kernel_and_limit(tmp_path: Path) -> None:
    """Faults: the sparse MLA kernel with two stages of 128 x 512 bf16 tiles; a
    required module with a kernel that no scenario reaches."""
    proc, report = sm_check(
        tmp_path,
        "--target",
        "sm_120",
        "--no-dense",
        "--tp",
        "8",
        "--override",
        "_sparse_mla_kernel:num_stages=2,BLOCK_N=128",
        # and a module with a kernel no scenario launches (speculative decoding only)
        "--require-traced",
        "vllm.v1.attention.backends.mla.indexer",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    fails = [f for f in report["failures"] if f.startswith("_sparse_mla_kernel")]
    assert fails, report["failures"]
    m = re.search(r"needs (\d+) bytes of shared memory per block, sm_120 allows 101376", fails[0])
    assert m and int(m.group(1)) > 101376
    assert "FAIL _sparse_mla_kernel" in proc.stderr
    assert (
        "vllm.v1.attention.backends.mla.indexer:_prepare_uniform_decode_kernel: a Triton kernel of a required "
        "module that no scenario launched" in report["failures"]
    )
