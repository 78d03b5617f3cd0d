"""Filters of role bench."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_TQDM = re.compile(r"(\d+)/(\d+) \[")


def glm5_bench_loopback(address: str) -> str:
    """A listen address as a URL host: a wildcard is reached on loopback; IPv6 in brackets."""
    if address in ("0.0.0.0", ""):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def glm5_bench_progress(log_tail: str, total: int) -> dict[str, int]:
    """The last ``done/total`` of the generator's main progress bar (tqdm) in its log, the
    bar whose total is the point's request count (the warm-up bar has its own); 0/0 before."""
    found = [(int(d), int(t)) for d, t in _TQDM.findall(log_tail.replace("\r", "\n")) if int(t) == int(total)]
    if not found:
        return {"done": 0, "total": 0}
    done, seen_total = found[-1]
    return {"done": done, "total": seen_total}


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"glm5_bench_loopback": glm5_bench_loopback, "glm5_bench_progress": glm5_bench_progress}
