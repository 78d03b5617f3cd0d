"""The server's own view: its Prometheus /metrics before and after the benchmark.

vLLM 0.20.2's names (vllm/v1/metrics/loggers.py; counters carry ``_total`` in the
exposition): ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``
(tokens), ``vllm:kv_cache_usage_perc`` (0..1), ``vllm:spec_decode_num_drafts_total``,
``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:num_preemptions_total``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse(text: str) -> dict[str, float]:
    """Sum of every sample of each metric name (all label sets: engines, models)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


def _counter(sums: dict[str, float], name: str) -> float | None:
    for candidate in (f"{name}_total", name):
        if candidate in sums:
            return sums[candidate]
    return None


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    a, b = _counter(after, name), _counter(before, name)
    if a is None:
        return None
    return a - (b or 0.0)


@dataclass(frozen=True)
class ServerView:
    """What the server counted during the run (after - before), and its gauges after."""

    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    prefix_cache_hit_rate: float | None
    spec_decode: bool
    spec_decode_drafts: float | None
    spec_decode_draft_tokens: float | None
    spec_decode_accepted_tokens: float | None
    spec_decode_acceptance_rate: float | None
    spec_decode_acceptance_length: float | None
    kv_cache_usage_before: float | None
    kv_cache_usage_after: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    preemptions: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_view(before_text: str, after_text: str) -> ServerView:
    before, after = parse(before_text), parse(after_text)
    queries = _delta(before, after, "vllm:prefix_cache_queries")
    hits = _delta(before, after, "vllm:prefix_cache_hits")
    drafts = _delta(before, after, "vllm:spec_decode_num_drafts")
    draft_tokens = _delta(before, after, "vllm:spec_decode_num_draft_tokens")
    accepted = _delta(before, after, "vllm:spec_decode_num_accepted_tokens")
    spec = any(name.startswith("vllm:spec_decode") for name in after)
    return ServerView(
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
        spec_decode=spec,
        spec_decode_drafts=drafts,
        spec_decode_draft_tokens=draft_tokens,
        spec_decode_accepted_tokens=accepted,
        spec_decode_acceptance_rate=(accepted / draft_tokens) if draft_tokens and accepted is not None else None,
        # Tokens a draft round yields: the target's own token plus the accepted drafts.
        spec_decode_acceptance_length=(1 + accepted / drafts) if drafts and accepted is not None else None,
        kv_cache_usage_before=before.get("vllm:kv_cache_usage_perc"),
        kv_cache_usage_after=after.get("vllm:kv_cache_usage_perc"),
        prompt_tokens=_delta(before, after, "vllm:prompt_tokens"),
        generation_tokens=_delta(before, after, "vllm:generation_tokens"),
        preemptions=_delta(before, after, "vllm:num_preemptions"),
    )
