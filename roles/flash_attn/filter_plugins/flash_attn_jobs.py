"""MAX_JOBS for the flash-attn build, capped from the host's facts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number, got {value!r}") from exc
    if number < 0:
        raise ValueError(f"{name} must not be negative, got {number}")
    return number


def flash_attn_max_jobs(
    cores: Any,
    available_mb: Any,
    job_peak_mb: Any,
    nvcc_threads: Any = 1,
    reserve_mb: Any = 0,
) -> int:
    """Largest parallel job count whose memory fits, never above the cores, at least 1.

    One ninja job (one nvcc of one .cu file) peaks at about job_peak_mb per nvcc
    thread, so a job costs job_peak_mb * nvcc_threads; the budget is the available
    memory minus a reserve for everything else on the host.
    """
    n_cores = _non_negative_int("cores", cores)
    avail = _non_negative_int("available_mb", available_mb)
    peak = _non_negative_int("job_peak_mb", job_peak_mb)
    threads = _non_negative_int("nvcc_threads", nvcc_threads)
    reserve = _non_negative_int("reserve_mb", reserve_mb)
    if peak == 0:
        raise ValueError("job_peak_mb must be positive")
    per_job = peak * max(threads, 1)
    by_memory = max(avail - reserve, 0) // per_job
    return max(1, min(n_cores, by_memory))


class FilterModule:
    """flash_attn filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"flash_attn_max_jobs": flash_attn_max_jobs}
