"""tools/gpu/sparse_bench.py, the GPU harness of patch 0011's sparse decode step: what runs
without a GPU.

The timings need the device (docs/validation/sparse-speed/README.md). Here: the harness
calls the patched kernel file as it is now (every function and setting it names exists
with the parameters it passes; a renamed setting would make a GPU call fail or measure
the wrong thing), and the tables of recorded results.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
RECORDED = json.loads((ROOT / "docs" / "validation" / "sparse-speed" / "results.json").read_text())


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load(ROOT / "tools" / "gpu" / "sparse_bench.py", "sparse_bench")


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    import conftest

    return load(conftest.PATCHED_SITE / "vllm/v1/attention/backends/mla/sparse_utils.py", "su_new")


def test_the_harness_calls_what_the_kernel_file_has(bench: ModuleType, kernels: ModuleType) -> None:
    for fn in ("topk_path", "indexer_topk", "token_request_and_context", "indexer_logits", "sparse_mla"):
        assert callable(getattr(kernels, fn, None)), fn
    for setting in ("INDEXER_ROWS_M", "INDEXER_NUM_STAGES", "INDEXER_DOT_DTYPE"):
        assert hasattr(kernels, setting), setting
    params = inspect.signature(kernels.indexer_logits).parameters
    for name, kw in bench.SWEEP:
        unknown = set(kw) - set(params)
        assert not unknown, f"SWEEP {name}: indexer_logits takes no {sorted(unknown)}"
        assert kw.get("dot_dtype", "bf16") in ("bf16", "fp16", "fp8"), name
    assert set(bench.ORDER) <= {name for name, _ in bench.SWEEP}


def test_summarize_the_recorded_step(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text(json.dumps(RECORDED["run3/results.json"]))
    assert bench.cli(["summarize", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA H100 80GB HBM3 (SM 9.0), read bandwidth measured 3128 GB/s")
    assert "| 4k | 1 | 8 | 0.005 / 0.013 / 0.010 = **0.029** |" in out


def test_summarize_the_recorded_score_kernel_sweep(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.json").write_text(json.dumps(RECORDED["run4/idx-sweep2/results.json"]))
    bench.cli(["summarize", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "| 64k | 64 | 553.6 | 0.369 | **0.283** | 0.201 | 1.30 | 1.41 |" in out
