"""The verdict table, the JSON report and the MLA dims: tool venv only (no torch)."""

from __future__ import annotations

import json
import math

import pytest

from glm5_tools.diagnostics.dims import MLADims
from glm5_tools.diagnostics.result import StageResult, Verdict, render_table, write_json

GLM5 = {"num_attention_heads": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64, "v_head_dim": 256, "q_lora_rank": 2048, "hidden_size": 6144}


def test_judge_pass_fail_and_nan():
    assert StageResult.judge(1, "x", 1e-4, 1e-3, "cpu", []).verdict is Verdict.PASS
    assert StageResult.judge(1, "x", 1e-2, 1e-3, "cpu", []).verdict is Verdict.FAIL
    assert StageResult.judge(1, "x", math.nan, 1e-3, "cpu", []).verdict is Verdict.FAIL


def test_table_names_first_failing_stage(tmp_path):
    results = [StageResult.judge(1, "dequant", 1e-4, 1e-3, "gpu", ["ok"]),
               StageResult.judge(2, "mapping", 3, 0, "cpu", ["unmapped: a"]),
               StageResult.skip(5, "e2e", "no server")]
    table = render_table(results)
    assert "first failing stage is 2 (mapping)" in table
    assert "unmapped: a" in table and "SKIP" in table
    write_json(results, tmp_path / "r.json", {"tp": 8})
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is False and data["failed_stages"] == [2]
    assert data["stages"][2]["verdict"] == "skip"


def test_glm5_per_rank_dims():
    d = MLADims.from_config(GLM5).per_rank(8)
    assert (d.num_heads, d.qk_head_dim, d.v_head_dim) == (8, 256, 256)
    assert d.softmax_scale == pytest.approx(256 ** -0.5)
    with pytest.raises(ValueError, match="do not split"):
        MLADims.from_config(GLM5).per_rank(7)


def test_yarn_mscale_enters_softmax_scale():
    cfg = dict(GLM5, rope_scaling={"type": "yarn", "factor": 40, "mscale_all_dim": 1.0})
    m = 0.1 * math.log(40) + 1.0
    assert MLADims.from_config(cfg).softmax_scale == pytest.approx(256 ** -0.5 * m * m)
