"""The all-reduce check end to end on CPU: gloo backend, spawned processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from glm5_tools.nccl_check.allreduce import parse_args, run_check

SRC = Path(__file__).resolve().parents[3] / "src"


def test_two_ranks_sum_exact():
    res = run_check(2, backend="gloo", size_mb=1.0, iterations=3, timeout_s=120)
    assert res.ok, res.message
    assert res.sum_exact and res.mismatches == 0
    assert res.world_size == 2
    assert res.busbw_gbps > 0
    assert res.busbw_gbps == pytest.approx(res.algbw_gbps)  # 2 (n-1)/n = 1 for n = 2


def test_floor_fails_with_acs_hint():
    res = run_check(2, backend="gloo", size_mb=1.0, iterations=2, min_busbw_gbps=1e9)
    assert not res.ok
    assert "ACS" in res.message


def test_fallback_env_is_applied(monkeypatch):
    monkeypatch.delenv("NCCL_P2P_LEVEL", raising=False)
    res = run_check(1, backend="gloo", size_mb=0.1, iterations=1, p2p_level="PHB")
    assert res.ok
    assert res.env == {"NCCL_P2P_LEVEL": "PHB"}
    assert os.environ["NCCL_P2P_LEVEL"] == "PHB"


def test_cli_prints_json_last():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm5_tools.nccl_check",
            "--backend",
            "gloo",
            "--world-size",
            "2",
            "--size-mb",
            "0.5",
            "--iterations",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["sum_exact"] and out["world_size"] == 2


def test_parse_args_defaults():
    args = parse_args([])
    assert args.world_size == 0 and args.backend == "nccl" and not args.p2p_disable
