"""Pure helpers of the all-reduce check: NCCL environment, bandwidth, verdict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

# The values NCCL_P2P_LEVEL accepts (NCCL's environment documentation).
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")

ACS_HINT = (
    "GPU peer-to-peer looks broken or slow. Check the PCIe ACS setting of the "
    "bridges above the GPUs (gpu_tuning_acs_disable), the IOMMU mode on the kernel "
    "command line (iommu=pt) and the firmware (Above 4G decoding, Resizable BAR); "
    "as a fallback set nccl_check_p2p_disable / NCCL_P2P_DISABLE=1 or "
    "nccl_check_p2p_level / NCCL_P2P_LEVEL (docs/production.md)."
)


def nccl_env(p2p_disable: bool = False, p2p_level: str = "") -> dict[str, str]:
    """Return the NCCL variables that select the peer-to-peer fallback.

    ``p2p_disable`` turns peer-to-peer off (traffic goes through host memory);
    ``p2p_level`` caps the topology distance at which NCCL still uses it.
    """
    env: dict[str, str] = {}
    if p2p_disable:
        env["NCCL_P2P_DISABLE"] = "1"
    if p2p_level:
        level = p2p_level.upper()
        if level not in P2P_LEVELS:
            raise ValueError(f"NCCL_P2P_LEVEL must be one of {', '.join(P2P_LEVELS)}, not {p2p_level!r}")
        env["NCCL_P2P_LEVEL"] = level
    return env


def pattern_value(index: int, rank: int) -> int:
    """The value rank ``rank`` contributes at element ``index`` (exact in float32)."""
    return (rank + 1) * ((index % 251) + 1)


def expected_sum(index: int, world_size: int) -> int:
    """The exact all-reduce sum at element ``index`` over ``world_size`` ranks."""
    return ((index % 251) + 1) * world_size * (world_size + 1) // 2


def bus_bandwidth_gbps(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """Algorithm and bus bandwidth in GB/s of one all-reduce of ``nbytes``.

    Bus bandwidth follows nccl-tests: algbw * 2 (n - 1) / n, the rate each link
    carries; it is 0 for one rank, where no data crosses a link.
    """
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    algbw = nbytes / seconds / 1e9
    busbw = algbw * 2 * (world_size - 1) / world_size
    return algbw, busbw


@dataclass
class Result:
    """The outcome of one check, printed as JSON on the last line."""

    world_size: int
    backend: str
    nbytes: int
    iterations: int
    seconds_per_iter: float
    algbw_gbps: float
    busbw_gbps: float
    sum_exact: bool
    mismatches: int
    min_busbw_gbps: float
    env: dict[str, str] = field(default_factory=dict)
    ok: bool = False
    message: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def verdict(result: Result) -> Result:
    """Fill ``ok`` and ``message``: the sum must be exact, bandwidth above the floor."""
    if not result.sum_exact:
        result.ok = False
        result.message = (
            f"all-reduce over {result.world_size} ranks returned {result.mismatches} wrong elements. {ACS_HINT}"
        )
        return result
    if result.world_size > 1 and result.busbw_gbps < result.min_busbw_gbps:
        result.ok = False
        result.message = (
            f"all-reduce bus bandwidth {result.busbw_gbps:.1f} GB/s is below the "
            f"{result.min_busbw_gbps:.1f} GB/s floor. {ACS_HINT}"
        )
        return result
    result.ok = True
    result.message = (
        f"all-reduce over {result.world_size} ranks exact; "
        f"algbw {result.algbw_gbps:.1f} GB/s, busbw {result.busbw_gbps:.1f} GB/s"
    )
    return result
