"""The benchmark plan: profiles expanded into points, each with the load generator's
command line (``vllm bench serve``, random dataset).

A profile (role bench's ``bench_profiles``) is a mapping::

    {"kind": "concurrency" | "context" | "prefill",
     "input_len": 1024 | [8192, 65536] | "max",
     "output_len": 256,
     "concurrency": 1 | [1, 8, 32, 64],
     "num_prompts": 0}          # 0: concurrency x prompts_per_user, at least min_prompts

``input_len: "max"`` is the served ``max_model_len`` less ``output_len`` and a margin.
A point that does not fit the served ``max_model_len`` is skipped, with the reason.
The same command line is built for every runner: only the executable, the wrapper in
front of it and the paths differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("concurrency", "context", "prefill")


class PlanError(ValueError):
    """A profile that cannot be expanded; the message names the profile and the field."""


@dataclass(frozen=True)
class Point:
    id: str
    profile: str
    kind: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    argv: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Settings:
    """What every point's command line shares."""

    base_url: str
    model: str
    tokenizer: str
    result_dir: str
    vllm: str = "vllm"
    wrapper: tuple[str, ...] = ()
    point_timeout_s: int = 1800
    prompts_per_user: int = 4
    min_prompts: int = 4
    max_prompts: int = 512
    long_margin: int = 64
    warmups: int = 1
    seed: int = 0
    insecure: bool = False


def _as_list(value: Any, what: str) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise PlanError(f"{what} is empty")
    return items


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{what} is {value!r}; expected a whole number >= 1")
    return value


def generator_argv(settings: Settings, point: Point, index: int = 0) -> list[str]:
    """`vllm bench serve` for one point, bounded in time by coreutils' timeout. Each point
    has its own seed (settings.seed + its index), so that its prompts are not those of the
    point before, which the server's prefix cache would answer from memory."""
    argv = [
        *settings.wrapper,
        "timeout",
        "--kill-after=30",
        str(settings.point_timeout_s),
        settings.vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        settings.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        settings.model,
        "--served-model-name",
        settings.model,
        "--tokenizer",
        settings.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(point.input_len),
        "--random-output-len",
        str(point.output_len),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--num-prompts",
        str(point.num_prompts),
        "--max-concurrency",
        str(point.concurrency),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(settings.warmups),
        "--seed",
        str(settings.seed + index),
        # The generator's first request (its ready check) is one of the point's own
        # prompts: a 64k prompt's prefill can take longer than the generator's usual
        # bound, so the check may take as long as the point (readiness itself was
        # checked before any load).
        "--ready-check-timeout-sec",
        str(settings.point_timeout_s),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--label",
        point.id,
        "--save-result",
        # per request: the first token's time, the gaps between streamed chunks and the
        # counted tokens, from which the report recounts a server's output that the
        # generator could only count by re-tokenizing its text (report.figures)
        "--save-detailed",
        "--result-dir",
        settings.result_dir,
        "--result-filename",
        f"{point.id}.json",
    ]
    if settings.insecure:
        argv.append("--insecure")
    return argv


def expand(
    profiles: dict[str, dict[str, Any]],
    selected: list[str],
    max_model_len: int,
    settings: Settings,
) -> tuple[list[Point], list[dict[str, str]]]:
    """Points to run, in order, and the points skipped with their reasons."""
    points: list[Point] = []
    skipped: list[dict[str, str]] = []
    for name in selected:
        if name not in profiles:
            raise PlanError(f"profile {name!r} is selected but not defined (defined: {sorted(profiles)})")
        profile = profiles[name]
        kind = profile.get("kind")
        if kind not in KINDS:
            raise PlanError(f"profile {name!r}: kind is {kind!r}; expected one of {list(KINDS)}")
        output_len = _positive(profile.get("output_len"), f"profile {name!r}: output_len")
        for raw_input in _as_list(profile.get("input_len"), f"profile {name!r}: input_len"):
            if raw_input == "max":
                input_len = max_model_len - output_len - settings.long_margin
                if input_len < 1:
                    raise PlanError(
                        f"profile {name!r}: input_len max leaves no room under max_model_len {max_model_len}"
                    )
            else:
                input_len = _positive(raw_input, f"profile {name!r}: input_len")
            for raw_conc in _as_list(profile.get("concurrency", 1), f"profile {name!r}: concurrency"):
                concurrency = _positive(raw_conc, f"profile {name!r}: concurrency")
                point_id = f"{name}-in{input_len}-out{output_len}-c{concurrency}"
                if input_len + output_len > max_model_len:
                    skipped.append({
                        "id": point_id,
                        "reason": f"{input_len} in + {output_len} out exceeds the served max_model_len {max_model_len}",
                    })
                    continue
                wanted = profile.get("num_prompts") or max(concurrency * settings.prompts_per_user,
                                                           settings.min_prompts)
                num_prompts = min(_positive(wanted, f"profile {name!r}: num_prompts"), settings.max_prompts)
                point = Point(point_id, name, kind, input_len, output_len, concurrency, num_prompts)
                argv = generator_argv(settings, point, len(points))
                points.append(Point(**{**point.as_dict(), "argv": argv}))
    return points, skipped
