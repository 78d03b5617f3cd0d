"""Figures from the load generator's JSON, the Markdown table, the plots and the verdict.

One run is a directory: ``plan.json`` (the points, written by the play), ``raw/<id>.json``
(``vllm bench serve --save-result``), ``metrics-before.prom`` / ``metrics-after.prom``,
optionally ``llama_cpp/raw/<id>.json`` (the side-by-side). This module writes
``summary.json``, ``report.md`` and the PNG plots next to them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glm5_tools.bench.metrics import ServerView, server_view

# Figures where more is better; the others (latencies, errors) are better lower.
HIGHER_IS_BETTER = ("output_throughput", "tokens_per_user", "prefill_throughput", "request_throughput")
FIGURES = (
    "output_throughput",
    "tokens_per_user",
    "prefill_throughput",
    "request_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "failed",
)
SELECTORS = ("profile", "kind", "input_len", "output_len", "concurrency")


class ReportError(ValueError):
    """A run directory or a threshold that cannot be read; the message names it."""


def _percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as the generator computes its own."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def recount(raw: dict[str, Any], max_tokens: int) -> dict[str, Any] | None:
    """Output tokens and TPOT recounted per request, where the generator's count cannot
    be the server's; None where every count is possible.

    The generator takes a request's output tokens from the usage the server streams
    last, and otherwise re-tokenizes the generated text with the model's tokenizer.
    llama-server sends its usage in the same event as its last choice, which the
    generator does not read, so its text is re-tokenized: with weights that write no
    language (the serving slice's random ones) that count was 3x the tokens generated
    (391 for 128). A count above the request's max_tokens cannot be the server's; such
    a request is recounted as its streamed chunks (llama-server streams one token an
    event), and its TPOT as the time after the first chunk over the chunks after it.
    Needs the per-request lists of ``--save-detailed``."""
    lens, ttfts, itls = raw.get("output_lens"), raw.get("ttfts"), raw.get("itls")
    if not (isinstance(lens, list) and isinstance(ttfts, list) and isinstance(itls, list)):
        return None
    if not any(isinstance(n, int) and n > max_tokens for n in lens):
        return None
    counts: list[int] = []
    tpots: list[float] = []
    for n, gaps in zip(lens, itls, strict=False):
        if not isinstance(gaps, list) or not isinstance(n, int) or n <= 0:
            continue  # a failed request: no tokens
        count = len(gaps) + 1 if n > max_tokens else n
        counts.append(count)
        if count > 1:
            tpots.append(sum(gaps) / (count - 1) * 1000.0)
    duration = raw.get("duration")
    return {
        "total_output_tokens": sum(counts),
        "output_throughput": sum(counts) / duration if isinstance(duration, (int, float)) and duration else None,
        "p50_tpot_ms": _percentile(tpots, 50) if tpots else None,
        "p99_tpot_ms": _percentile(tpots, 99) if tpots else None,
    }


def first_tokens_uncached(raw: dict[str, Any]) -> dict[str, Any] | None:
    """TTFT over the requests whose prompt the server had not seen; None without the
    per-request lists of ``--save-detailed`` or with fewer than 2 requests.

    ``vllm bench serve`` sends its first request's prompt twice before the point (its
    ready check and its warm-up), so the server's prefix cache answers almost all of that
    request's prefill: at one user with two prompts the generator's TTFT p50 is the mean
    of a cached and an uncached prefill (the serving slice: 123 ms reported, 198 ms for
    the uncached 1k prompt, 48 for the cached one). The first request is left out of the
    first-token figures (its decode is unaffected and stays in the others)."""
    ttfts, inputs, errors = raw.get("ttfts"), raw.get("input_lens"), raw.get("errors")
    if not (isinstance(ttfts, list) and isinstance(inputs, list)) or len(ttfts) < 2:
        return None
    kept = [(float(t) * 1000.0, n) for i, (t, n) in enumerate(zip(ttfts, inputs, strict=False))
            if i > 0 and isinstance(t, (int, float)) and t > 0
            and not (isinstance(errors, list) and i < len(errors) and errors[i])]
    if not kept:
        return None
    times = [t for t, _ in kept]
    return {"p50_ttft_ms": _percentile(times, 50), "p99_ttft_ms": _percentile(times, 99),
            "mean_input_tokens": sum(n for _, n in kept) / len(kept), "ttft_requests": len(kept)}


def figures(raw: dict[str, Any], max_tokens: int | None = None) -> dict[str, float | None]:
    """The figures of one point from ``vllm bench serve``'s result JSON.

    tokens_per_user is the decode speed one user sees, 1000 / median TPOT (ms);
    prefill_throughput is the mean prompt length over the median TTFT (s), the
    prefill speed of a request when TTFT is mostly prefill (concurrency 1); both leave
    out the first request, whose prompt the server has cached (first_tokens_uncached). With
    max_tokens (the point's output length), output counts the generator cannot have
    had from the server are recounted (recount); ``recounted`` is then 1.
    """
    fixed = recount(raw, max_tokens) if max_tokens else None
    if fixed:
        raw = {**raw, **{k: v for k, v in fixed.items() if v is not None}}

    def num(key: str) -> float | None:
        value = raw.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    completed = num("completed") or 0.0
    tpot = num("p50_tpot_ms") or num("median_tpot_ms")
    input_tokens = num("total_input_tokens")
    mean_input = (input_tokens / completed) if input_tokens is not None and completed else None
    uncached = first_tokens_uncached(raw)
    if uncached:
        raw = {**raw, "p50_ttft_ms": uncached["p50_ttft_ms"], "p99_ttft_ms": uncached["p99_ttft_ms"]}
        mean_input = uncached["mean_input_tokens"]
    ttft = num("p50_ttft_ms") or num("median_ttft_ms")
    return {
        "completed": completed,
        "failed": num("failed"),
        "duration_s": num("duration"),
        "output_throughput": num("output_throughput"),
        "request_throughput": num("request_throughput"),
        "tokens_per_user": (1000.0 / tpot) if tpot else None,
        "prefill_throughput": (mean_input / (ttft / 1000.0)) if mean_input and ttft else None,
        "mean_input_tokens": mean_input,
        "p50_ttft_ms": ttft,
        "p99_ttft_ms": num("p99_ttft_ms"),
        "p50_tpot_ms": tpot,
        "p99_tpot_ms": num("p99_tpot_ms"),
        "p50_itl_ms": num("p50_itl_ms") or num("median_itl_ms"),
        "p99_itl_ms": num("p99_itl_ms"),
        "recounted": 1.0 if fixed else 0.0,
        # requests in the first-token figures: all but the first (its prompt was the
        # generator's ready check and warm-up), or every one without per-request lists
        "ttft_requests": float(uncached["ttft_requests"]) if uncached else completed,
    }


@dataclass
class Check:
    name: str
    point: str
    figure: str
    bound: str  # "min" or "max"
    limit: float
    value: float | None
    ok: bool
    source: str = ""

    def line(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.2f}"
        rel = ">=" if self.bound == "min" else "<="
        verdict = "PASS" if self.ok else "FAIL"
        return f"{verdict} {self.name} [{self.point}] {self.figure} {shown} (want {rel} {self.limit:g})"


@dataclass
class Verdict:
    ok: bool
    threshold_checks: list[Check] = field(default_factory=list)
    regression_checks: list[Check] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    previous_run: str | None = None

    @property
    def failures(self) -> list[str]:
        return [c.line() for c in self.threshold_checks + self.regression_checks if not c.ok]


def _matches(point: dict[str, Any], selector: dict[str, Any]) -> bool:
    return all(point.get(key) == selector[key] for key in SELECTORS if key in selector)


def check_thresholds(
    points: list[dict[str, Any]], thresholds: list[dict[str, Any]], spec_decode: bool
) -> tuple[list[Check], list[str]]:
    """Each threshold against every point it selects (profile, kind, input_len, output_len,
    concurrency; none: every point). ``min_spec_decode`` replaces ``min`` when the server
    reports speculative decoding."""
    checks: list[Check] = []
    not_measured: list[str] = []
    for entry in thresholds:
        name = str(entry.get("name") or entry.get("figure"))
        figure = entry.get("figure")
        if figure not in FIGURES:
            raise ReportError(f"threshold {name!r}: figure is {figure!r}; expected one of {list(FIGURES)}")
        bounds = [(b, entry[b]) for b in ("min", "max") if entry.get(b) is not None]
        if spec_decode and entry.get("min_spec_decode") is not None:
            bounds = [(b, v) for b, v in bounds if b != "min"] + [("min", entry["min_spec_decode"])]
        if not bounds:
            raise ReportError(f"threshold {name!r}: neither min nor max is set")
        selected = [p for p in points if _matches(p, entry)]
        if not selected:
            not_measured.append(f"{name}: no point of this run matches {_selector_text(entry)}")
            continue
        for point in selected:
            value = point["figures"].get(figure)
            for bound, limit in bounds:
                limit_f = float(limit)
                ok = value is not None and (value >= limit_f if bound == "min" else value <= limit_f)
                checks.append(Check(name, point["id"], figure, bound, limit_f, value, ok, str(entry.get("source", ""))))
    return checks, not_measured


def _selector_text(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}={entry[k]}" for k in SELECTORS if k in entry) or "every point"


def check_regression(
    points: list[dict[str, Any]], previous: list[dict[str, Any]], pct: float, watched: list[str]
) -> list[Check]:
    """Each watched figure of each point against the same point of the previous run: worse
    by more than ``pct`` percent fails."""
    before = {p["id"]: p for p in previous}
    checks: list[Check] = []
    for point in points:
        old = before.get(point["id"])
        if old is None:
            continue
        for figure in watched:
            new_v, old_v = point["figures"].get(figure), old["figures"].get(figure)
            if new_v is None or old_v is None or old_v == 0:
                continue
            if figure in HIGHER_IS_BETTER:
                limit = old_v * (1 - pct / 100.0)
                checks.append(Check(f"regression vs previous ({old_v:.2f})", point["id"], figure, "min", limit,
                                    new_v, new_v >= limit))
            else:
                limit = old_v * (1 + pct / 100.0)
                checks.append(Check(f"regression vs previous ({old_v:.2f})", point["id"], figure, "max", limit,
                                    new_v, new_v <= limit))
    return checks


def load_points(run_dir: Path, plan: list[dict[str, Any]], sub: str = "") -> list[dict[str, Any]]:
    points = []
    for entry in plan:
        path = run_dir / sub / "raw" / f"{entry['id']}.json"
        if not path.is_file():
            raise ReportError(f"{path}: missing (the generator wrote no result for point {entry['id']})")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}: not JSON ({exc})") from exc
        info = {k: entry[k] for k in ("id", "profile", "kind", "input_len", "output_len", "concurrency",
                                      "num_prompts")}
        points.append({**info, "figures": figures(raw, int(entry["output_len"]))})
    return points


def find_previous(host_dir: Path, current: Path) -> Path | None:
    """The newest earlier run of the same host that has a summary."""
    runs = sorted(d for d in host_dir.iterdir() if d.is_dir() and d.name < current.name
                  and (d / "summary.json").is_file())
    return runs[-1] if runs else None


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def table(points: list[dict[str, Any]]) -> list[str]:
    head = ("| point | in | out | conc | prompts | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms "
            "| out tok/s | tok/s/user | prefill tok/s | errors |")
    rows = [head, "|" + "---|" * 12]
    for p in points:
        f = p["figures"]
        rows.append(
            f"| {p['id']} | {p['input_len']} | {p['output_len']} | {p['concurrency']} | {p['num_prompts']} "
            f"| {_fmt(f['p50_ttft_ms'])} / {_fmt(f['p99_ttft_ms'])} | {_fmt(f['p50_tpot_ms'], 2)} / "
            f"{_fmt(f['p99_tpot_ms'], 2)} | {_fmt(f['p50_itl_ms'], 2)} / {_fmt(f['p99_itl_ms'], 2)} "
            f"| {_fmt(f['output_throughput'])} | {_fmt(f['tokens_per_user'])} | {_fmt(f['prefill_throughput'], 0)} "
            f"| {_fmt(f['failed'], 0)} |"
        )
    return rows


def plot(points: list[dict[str, Any]], run_dir: Path, others: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """throughput_vs_concurrency.png and tpot_vs_context.png; returns the series drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn: dict[str, Any] = {}
    servers = {"vLLM": points, **others}
    specs = [
        ("throughput_vs_concurrency.png", "concurrency", "concurrency", "output_throughput",
         "output tokens/s (all users)", "Throughput vs concurrency"),
        ("tpot_vs_context.png", "context", "input_len", "p50_tpot_ms", "TPOT p50 (ms)", "TPOT vs context length"),
    ]
    for filename, kind, x_key, y_key, y_label, title in specs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series: dict[str, list[list[float]]] = {}
        # One line a server: every point of the kind (all its profiles), by x.
        for server, pts in servers.items():
            chosen = sorted((p for p in pts if p["kind"] == kind and p["figures"].get(y_key) is not None),
                            key=lambda p: p[x_key])
            if not chosen:
                continue
            xy = [[float(p[x_key]), float(p["figures"][y_key])] for p in chosen]
            series[server] = xy
            ax.plot([a for a, _ in xy], [b for _, b in xy], marker="o", label=server)
        if kind == "concurrency":
            per_user = {label: xy for label, xy in series.items()}
            drawn["throughput_vs_concurrency_per_user"] = {
                label: [[x, y / x] for x, y in xy] for label, xy in per_user.items()
            }
        ax.set_xlabel("concurrent requests" if kind == "concurrency" else "input tokens")
        ax.set_ylabel(y_label)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend()
            if kind == "context":
                ax.set_xscale("log", base=2)
        else:
            ax.text(0.5, 0.5, f"no {kind} points in this run", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        fig.savefig(run_dir / filename, dpi=100)
        plt.close(fig)
        drawn[filename] = series
    return drawn


def server_section(view: ServerView) -> list[str]:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    spec = ("off (no vllm:spec_decode_* series)" if not view.spec_decode else
            f"acceptance rate {pct(view.spec_decode_acceptance_rate)}, mean acceptance length "
            f"{_fmt(view.spec_decode_acceptance_length, 2)} over {_fmt(view.spec_decode_drafts, 0)} drafts")
    return [
        "| server metric (during the run) | value |",
        "|---|---|",
        f"| prefix-cache hit rate | {pct(view.prefix_cache_hit_rate)} "
        f"({_fmt(view.prefix_cache_hits, 0)} of {_fmt(view.prefix_cache_queries, 0)} tokens) |",
        f"| speculative decoding | {spec} |",
        f"| KV-cache usage before / after | {pct(view.kv_cache_usage_before)} / {pct(view.kv_cache_usage_after)} |",
        f"| prompt / generated tokens counted by the server | {_fmt(view.prompt_tokens, 0)} / "
        f"{_fmt(view.generation_tokens, 0)} |",
        f"| preemptions | {_fmt(view.preemptions, 0)} |",
    ]


def build(
    run_dir: Path,
    thresholds: list[dict[str, Any]],
    regression_pct: float,
    regression_figures: list[str],
    title: str = "",
) -> tuple[Verdict, dict[str, Any]]:
    """Reads a run directory, writes summary.json, report.md and the plots."""
    plan_doc = json.loads((run_dir / "plan.json").read_text())
    plan: list[dict[str, Any]] = plan_doc["points"]
    points = load_points(run_dir, plan)
    view = server_view(
        (run_dir / "metrics-before.prom").read_text() if (run_dir / "metrics-before.prom").is_file() else "",
        (run_dir / "metrics-after.prom").read_text() if (run_dir / "metrics-after.prom").is_file() else "",
    )
    others: dict[str, list[dict[str, Any]]] = {}
    if (run_dir / "llama_cpp" / "raw").is_dir():
        others["llama.cpp"] = load_points(run_dir, plan, "llama_cpp")

    for figure in regression_figures:
        if figure not in FIGURES:
            raise ReportError(f"regression figure {figure!r}; expected one of {list(FIGURES)}")
    checks, not_measured = check_thresholds(points, thresholds, view.spec_decode)
    previous_dir = find_previous(run_dir.parent, run_dir)
    regression: list[Check] = []
    if previous_dir is not None:
        previous = json.loads((previous_dir / "summary.json").read_text()).get("points", [])
        regression = check_regression(points, previous, regression_pct, regression_figures)
    verdict = Verdict(
        ok=all(c.ok for c in checks + regression),
        threshold_checks=checks,
        regression_checks=regression,
        not_measured=not_measured,
        previous_run=previous_dir.name if previous_dir else None,
    )
    drawn = plot(points, run_dir, others)

    lines = [f"# Serving benchmark {title or run_dir.name}", ""]
    lines += [f"Verdict: **{'PASS' if verdict.ok else 'FAIL'}**", ""]
    lines += [*table(points), ""]
    for skipped in plan_doc.get("skipped", []):
        lines.append(f"- skipped {skipped['id']}: {skipped['reason']}")
    sides = {"": points, **{f"{name} ": pts for name, pts in others.items()}}
    recounted = [f"{side}{p['id']}" for side, pts in sides.items() for p in pts if p["figures"]["recounted"]]
    if recounted:
        lines.append(f"- output tokens recounted from the streamed chunks (the generator's count exceeded "
                     f"max_tokens: re-tokenized text, not the server's count): {', '.join(recounted)}")
    lines += ["", *server_section(view), ""]
    if others:
        lines += ["## Side by side: vLLM / llama.cpp (same generator, same points)", "",
                  "| point | out tok/s vLLM | llama.cpp | ratio | TPOT p50 vLLM | llama.cpp |",
                  "|---|---|---|---|---|---|"]
        for mine, theirs in zip(points, others["llama.cpp"], strict=True):
            a, b = mine["figures"]["output_throughput"], theirs["figures"]["output_throughput"]
            ratio = _fmt(a / b, 2) if a and b else "-"
            tpot_a, tpot_b = mine["figures"]["p50_tpot_ms"], theirs["figures"]["p50_tpot_ms"]
            lines.append(f"| {mine['id']} | {_fmt(a)} | {_fmt(b)} | {ratio} | {_fmt(tpot_a, 2)} | {_fmt(tpot_b, 2)} |")
        lines.append("")
    lines += ["## Thresholds", ""] + [f"- {c.line()}" + (f" — {c.source}" if c.source else "") for c in checks]
    lines += [f"- not measured: {n}" for n in not_measured]
    lines += ["", f"## Against the previous run ({verdict.previous_run or 'none: this is the first run'}; "
              f"worse by more than {regression_pct:g} % fails)", ""]
    lines += [f"- {c.line()}" for c in regression] or ["- nothing to compare"]
    lines += ["", "![throughput vs concurrency](throughput_vs_concurrency.png)", "",
              "![TPOT vs context length](tpot_vs_context.png)", ""]
    (run_dir / "report.md").write_text("\n".join(lines))

    summary = {
        "run": run_dir.name,
        "points": points,
        "skipped": plan_doc.get("skipped", []),
        "server": view.as_dict(),
        "llama_cpp": others.get("llama.cpp", []),
        "plots": drawn,
        "verdict": {
            "ok": verdict.ok,
            "failures": verdict.failures,
            "not_measured": verdict.not_measured,
            "previous_run": verdict.previous_run,
            "threshold_checks": [asdict(c) for c in checks],
            "regression_checks": [asdict(c) for c in regression],
        },
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return verdict, summary
