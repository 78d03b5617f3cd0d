"""Round trip of the tiny GLM-5 fixture (llama.cpp-converted and -quantized GGUF).

Through the PATCHED loader's mapping and weight iteration every HF parameter of
the main model (the MTP layer is skipped by vLLM) is found exactly once and equals
the original: exactly for float types, within the quantization error for K-quants.
The same harness against the unpatched loader (and partly patched ones) fails,
showing what each patch fixes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import overlay
import pytest
import roundtrip

pytestmark = pytest.mark.skipif(
    not roundtrip.QUANT_GGUF.is_file(), reason="tiny fixture missing: run scripts/make-tiny-glm5"
)

VARIANTS = {
    "bf16": [roundtrip.BF16_GGUF],
    "ud-q4_k_xl": [roundtrip.QUANT_GGUF],
    "ud-q4_k_xl-split": roundtrip.SPLIT_GGUF,
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_patched_round_trip(variant: str) -> None:
    report = roundtrip.roundtrip(VARIANTS[variant], roundtrip.HF_DIR)
    assert report["error"] is None, report["error"]
    assert report["missing"] == [] and report["duplicates"] == [] and report["extra"] == []
    assert report["mismatch"] == {}
    assert report["n_found"] == report["n_main"] > 0
    # the indexer and kv_b_proj reach vLLM dequantized, never as qweight
    assert not [n for n in report["quantized"] if ".indexer." in n or "kv_b_proj" in n]
    if variant == "bf16":
        assert report["max_rel_err"] == {}  # everything compared exactly
    else:
        assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0"} <= set(report["max_rel_err"])


def unpatched(tmp_path: Path, applied: int, force_model_type: str = "") -> dict[str, Any]:
    site = overlay.make_overlay(tmp_path / "site", overlay.patches()[:applied])
    args = [f"--force-model-type={force_model_type}"] if force_model_type else []
    code = "import runpy; runpy.run_module('roundtrip', run_name='__main__')"
    proc = overlay.run_in(site, code, *args, str(roundtrip.QUANT_GGUF), str(roundtrip.HF_DIR))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("GLM5-REPORT ")]
    assert lines, proc.stderr[-3000:]
    return dict(json.loads(lines[0].removeprefix("GLM5-REPORT ")))


def test_unpatched_cannot_read_config(tmp_path: Path) -> None:
    """Without 0001 the pinned transformers does not know glm_moe_dsa."""
    report = unpatched(tmp_path, 0)
    assert report["stage"] == "config" and "glm_moe_dsa" in report["error"]


def test_without_0002_glm_moe_dsa_is_unknown(tmp_path: Path) -> None:
    report = unpatched(tmp_path, 1)
    assert report["stage"] == "mapping"
    assert "Unknown gguf model_type: glm_moe_dsa" in report["error"]


def test_unpatched_as_deepseek_v3_loses_indexer_and_kv_b(tmp_path: Path) -> None:
    """Forcing the config to deepseek_v3 (deepseek2 names) loads, but silently
    leaves the indexer and kv_b_proj of every layer unloaded."""
    report = unpatched(tmp_path, 0, force_model_type="deepseek_v3")
    assert report["error"] is None
    missing = report["missing"]
    assert any(".self_attn.kv_b_proj." in n for n in missing)
    assert any(".self_attn.indexer.wk." in n for n in missing)
    assert all(".self_attn.indexer." in n or ".kv_b_proj." in n for n in missing)


def test_without_0003_kv_b_and_indexer_wrong(tmp_path: Path) -> None:
    """0001+0002 map the names, but kv_b_proj arrives as two raw 3-D halves and
    the indexer's wk (a layer built without quant method) as a quantized qweight."""
    report = unpatched(tmp_path, 2)
    assert report["error"] is None
    kv_b = [n for n in report["mismatch"] if ".kv_b_proj." in n]
    assert kv_b and "shape" in report["mismatch"][kv_b[0]]
    assert any(".self_attn.indexer.wk." in n for n in report["quantized"])
