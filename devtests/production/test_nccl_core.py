"""Unit tests of the torch-free helpers of the all-reduce check."""

import json

import pytest

from glm5_tools.nccl_check.core import (
    Result,
    bus_bandwidth_gbps,
    expected_sum,
    nccl_env,
    pattern_value,
    verdict,
)


def _result(**kw):
    base = dict(
        world_size=8,
        backend="nccl",
        nbytes=1 << 28,
        iterations=20,
        seconds_per_iter=0.01,
        algbw_gbps=26.8,
        busbw_gbps=47.0,
        sum_exact=True,
        mismatches=0,
        min_busbw_gbps=10.0,
    )
    base.update(kw)
    return Result(**base)


def test_env_default_is_empty():
    assert nccl_env() == {}


def test_env_fallbacks():
    assert nccl_env(p2p_disable=True) == {"NCCL_P2P_DISABLE": "1"}
    assert nccl_env(p2p_level="pxb") == {"NCCL_P2P_LEVEL": "PXB"}


def test_env_refuses_unknown_level():
    with pytest.raises(ValueError, match="NCCL_P2P_LEVEL"):
        nccl_env(p2p_level="FAST")


@pytest.mark.parametrize("world", [1, 2, 8])
def test_expected_sum_is_sum_of_patterns(world):
    for index in (0, 1, 250, 251, 10_000):
        assert expected_sum(index, world) == sum(pattern_value(index, r) for r in range(world))
    # exact in float32: below 2**24
    assert expected_sum(250, 8) < 2**24


def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = bus_bandwidth_gbps(8_000_000_000, 1.0, 8)
    assert algbw == pytest.approx(8.0)
    assert busbw == pytest.approx(14.0)
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, 1) == (1.0, 0.0)


def test_bus_bandwidth_refuses_bad_input():
    with pytest.raises(ValueError):
        bus_bandwidth_gbps(1, 0.0, 2)
    with pytest.raises(ValueError):
        bus_bandwidth_gbps(1, 1.0, 0)


def test_verdict_ok():
    res = verdict(_result())
    assert res.ok
    assert "exact" in res.message
    assert json.loads(res.to_json())["ok"] is True


def test_verdict_wrong_sum_names_acs():
    res = verdict(_result(sum_exact=False, mismatches=3))
    assert not res.ok
    assert "3 wrong" in res.message
    assert "ACS" in res.message and "IOMMU" in res.message


def test_verdict_slow_names_acs():
    res = verdict(_result(busbw_gbps=2.0))
    assert not res.ok
    assert "below" in res.message and "ACS" in res.message


def test_verdict_single_rank_ignores_floor():
    assert verdict(_result(world_size=1, busbw_gbps=0.0)).ok
