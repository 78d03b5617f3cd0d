"""Unit tests of the flash_attn MAX_JOBS filter."""

from __future__ import annotations

import itertools

import pytest
from flash_attn_jobs import FilterModule, flash_attn_max_jobs


def test_memory_bound():
    # 16 cores, 20 GiB free, 4 GiB reserve, 2600 MiB a thread x 2 threads -> 16384 // 5200 = 3
    assert flash_attn_max_jobs(16, 20480, 2600, 2, 4096) == 3


def test_core_bound():
    assert flash_attn_max_jobs(2, 24000, 2600, 1, 4096) == 2


def test_at_least_one_when_memory_is_short():
    assert flash_attn_max_jobs(64, 1000, 2600, 4, 4096) == 1


def test_at_least_one_with_zero_cores_reported():
    assert flash_attn_max_jobs(0, 100000, 2600, 1, 0) == 1


def test_strings_from_facts_are_accepted():
    assert flash_attn_max_jobs("8", "65536", "2600", "2", "4096") == 8


@pytest.mark.parametrize(
    ("cores", "mem", "peak", "threads", "reserve"),
    list(
        itertools.product(
            [1, 2, 16, 128], [0, 3000, 24000, 131072, 560000], [1500, 2600], [1, 2, 4], [0, 4096]
        )
    ),
)
def test_invariants(cores, mem, peak, threads, reserve):
    jobs = flash_attn_max_jobs(cores, mem, peak, threads, reserve)
    assert jobs >= 1
    assert jobs <= max(cores, 1)
    if jobs > 1:
        assert jobs * peak * threads <= mem - reserve
    # one more job would not fit, or there are no more cores
    assert jobs == cores or (jobs + 1) * peak * threads > mem - reserve or jobs == 1


@pytest.mark.parametrize(
    "args",
    [
        (-1, 1000, 2600, 1, 0),
        (4, -5, 2600, 1, 0),
        (4, 1000, 0, 1, 0),
        (4, "lots", 2600, 1, 0),
        (True, 1, 1, 1, 0),
    ],
)
def test_bad_input_refused(args):
    with pytest.raises(ValueError):
        flash_attn_max_jobs(*args)


def test_registered_as_filter():
    assert FilterModule().filters()["flash_attn_max_jobs"] is flash_attn_max_jobs
