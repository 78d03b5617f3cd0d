"""glm5_tools.bench: the plan, the figures from `vllm bench serve`'s JSON (a result the
real generator wrote against vllm_probe_standin), the server's /metrics, the report,
the plots and the verdict against thresholds and the previous run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from glm5_tools.bench import metrics
from glm5_tools.bench.plan import PlanError, Settings, expand
from glm5_tools.bench.report import ReportError, build, check_regression, check_thresholds, figures

DATA = Path(__file__).parent / "data"
RAW = json.loads((DATA / "vllm-bench-serve-standin.json").read_text())
SETTINGS = Settings(base_url="https://127.0.0.1:8443", model="glm-5", tokenizer="/m/base", result_dir="/r/raw",
                    vllm="/opt/ml-env/bin/vllm", wrapper=("nice",))
PROFILES = {
    "sweep": {"kind": "concurrency", "input_len": 1024, "output_len": 256, "concurrency": [1, 8, 32, 64]},
    "context": {"kind": "context", "input_len": [8192, 65536], "output_len": 256, "concurrency": 1},
    "prefill": {"kind": "prefill", "input_len": 16384, "output_len": 1},
    "long": {"kind": "context", "input_len": "max", "output_len": 256},
}


def test_plan_expands_profiles_and_skips_what_does_not_fit():
    points, skipped = expand(PROFILES, ["sweep", "context", "prefill", "long"], 32768, SETTINGS)
    ids = [p.id for p in points]
    assert ids == ["sweep-in1024-out256-c1", "sweep-in1024-out256-c8", "sweep-in1024-out256-c32",
                   "sweep-in1024-out256-c64", "context-in8192-out256-c1", "prefill-in16384-out1-c1",
                   "long-in32448-out256-c1"]
    assert skipped == [{"id": "context-in65536-out256-c1",
                        "reason": "65536 in + 256 out exceeds the served max_model_len 32768"}]
    # Bounded: concurrency x prompts_per_user, capped by max_prompts.
    assert [p.num_prompts for p in points[:4]] == [4, 32, 128, 256]
    capped, _ = expand(PROFILES, ["sweep"], 32768, Settings(**{**SETTINGS.__dict__, "max_prompts": 100}))
    assert [p.num_prompts for p in capped] == [4, 32, 100, 100]


def test_plan_command_line():
    points, _ = expand(PROFILES, ["sweep"], 4096, SETTINGS)
    argv = points[1].argv
    assert argv[:4] == ["nice", "timeout", "--kill-after=30", "1800"]
    assert argv[4:7] == ["/opt/ml-env/bin/vllm", "bench", "serve"]
    pairs = {argv[i]: argv[i + 1] for i in range(7, len(argv) - 1)}
    assert pairs["--base-url"] == "https://127.0.0.1:8443"
    assert pairs["--random-input-len"] == "1024" and pairs["--random-output-len"] == "256"
    assert pairs["--max-concurrency"] == "8" and pairs["--num-prompts"] == "32"
    assert pairs["--result-filename"] == "sweep-in1024-out256-c8.json"
    # the generator's first request (a 64k prompt at a slow prefill) is bounded by the point's timeout
    assert pairs["--ready-check-timeout-sec"] == "1800"
    short, _ = expand(PROFILES, ["sweep"], 4096, Settings(**{**SETTINGS.__dict__, "point_timeout_s": 420}))
    sargv = short[0].argv
    assert sargv[sargv.index("--ready-check-timeout-sec") + 1] == "420"
    assert "--ignore-eos" in argv and "--save-result" in argv and "--insecure" not in argv


@pytest.mark.parametrize(
    ("profiles", "selected", "message"),
    [
        (PROFILES, ["nope"], "'nope' is selected but not defined"),
        ({"x": {"kind": "other", "input_len": 1, "output_len": 1}}, ["x"], "kind is 'other'"),
        ({"x": {"kind": "context", "input_len": 0, "output_len": 1}}, ["x"], "input_len is 0"),
        ({"x": {"kind": "context", "input_len": 8, "output_len": 1, "concurrency": [1, "a"]}}, ["x"],
         "concurrency is 'a'"),
        ({"x": {"kind": "context", "input_len": "max", "output_len": 4050}}, ["x"], "no room"),
    ],
)
def test_plan_refuses_bad_profiles(profiles, selected, message):
    with pytest.raises(PlanError, match=message):
        expand(profiles, selected, 4096, SETTINGS)


def test_figures_from_the_generator_json():
    f = figures(RAW)
    assert f["completed"] == 16 and f["failed"] == 0
    assert f["output_throughput"] == pytest.approx(548.44, rel=1e-3)
    assert f["tokens_per_user"] == pytest.approx(1000 / RAW["p50_tpot_ms"])
    assert f["prefill_throughput"] == pytest.approx((2050 / 16) / (RAW["p50_ttft_ms"] / 1000))
    assert f["p99_itl_ms"] == RAW["p99_itl_ms"]



def _streamed(counted: list[int], chunks: list[int], gap_s: float, duration: float) -> dict:
    """A generator result with --save-detailed's per-request lists: `counted` output
    tokens per request as the generator counted them, `chunks` streamed events each."""
    return {**RAW, "completed": len(counted), "duration": duration, "total_output_tokens": sum(counted),
            "output_lens": counted, "ttfts": [0.15] * len(counted),
            "itls": [[gap_s] * (c - 1) for c in chunks], "output_throughput": sum(counted) / duration,
            "p50_tpot_ms": 1.88, "p99_tpot_ms": 1.96}


def test_a_count_above_max_tokens_is_recounted_from_the_streamed_chunks():
    # llama-server with random weights: 128 tokens streamed one an event, the re-tokenized
    # text counted 391 and 389 (the slice's llama.cpp run); TPOT 5.7 ms, not 1.88
    raw = _streamed([391, 389], [128, 128], 0.0057, 1.768)
    f = figures(raw, 128)
    assert f["recounted"] == 1.0
    assert f["p50_tpot_ms"] == pytest.approx(5.7) and f["p99_tpot_ms"] == pytest.approx(5.7)
    assert f["tokens_per_user"] == pytest.approx(1000 / 5.7)
    assert f["output_throughput"] == pytest.approx(256 / 1.768)
    assert f["p50_ttft_ms"] == RAW["p50_ttft_ms"]  # the first token's time is the server's either way


def test_counts_the_server_gave_are_kept():
    # vLLM with MTP: usage says 128, fewer chunks carry them (several tokens an event)
    raw = _streamed([128, 128], [50, 60], 0.012, 2.0)
    f = figures(raw, 128)
    assert f["recounted"] == 0.0 and f["p50_tpot_ms"] == 1.88 and f["output_throughput"] == 128.0
    # and without the per-request lists (no --save-detailed) nothing can be recounted
    assert figures(RAW, 1)["recounted"] == 0.0


def test_the_first_request_is_left_out_of_the_first_token_figures():
    # the generator's ready check and warm-up send the first request's prompt: the server
    # answers its prefill from the prefix cache (the slice at one user: 48 against 198 ms)
    raw = {**RAW, "completed": 3, "input_lens": [1024, 1024, 2048], "ttfts": [0.048, 0.198, 0.300],
           "errors": ["", "", ""], "p50_ttft_ms": 123.0, "p99_ttft_ms": 196.3}
    f = figures(raw)
    assert f["ttft_requests"] == 2.0
    assert f["p50_ttft_ms"] == pytest.approx(249.0) and f["p99_ttft_ms"] == pytest.approx(298.98)
    assert f["prefill_throughput"] == pytest.approx(1536 / 0.249)
    # a failed request is left out too; one request alone keeps the generator's figures
    failed = figures({**raw, "errors": ["", "", "timeout"]})
    assert failed["ttft_requests"] == 1.0 and failed["p50_ttft_ms"] == pytest.approx(198.0)
    single = figures({**RAW, "completed": 1, "input_lens": [1024], "ttfts": [0.05]})
    assert single["ttft_requests"] == 1.0 and single["p50_ttft_ms"] == RAW["p50_ttft_ms"]

PROM_BEFORE = """# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="glm-5"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="glm-5"} 100.0
vllm:kv_cache_usage_perc{engine="0",model_name="glm-5"} 0.0
"""
PROM_AFTER = """vllm:prefix_cache_queries_total{engine="0",model_name="glm-5"} 3000.0
vllm:prefix_cache_hits_total{engine="0",model_name="glm-5"} 600.0
vllm:kv_cache_usage_perc{engine="0",model_name="glm-5"} 0.25
vllm:spec_decode_num_drafts_total{engine="0",model_name="glm-5"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="glm-5"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="glm-5"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="glm-5",position="0"} 90.0
"""


def test_server_view_deltas_and_spec_decode():
    view = metrics.server_view(PROM_BEFORE, PROM_AFTER)
    assert view.prefix_cache_hit_rate == pytest.approx(500 / 2000)
    assert view.kv_cache_usage_after == 0.25
    assert view.spec_decode and view.spec_decode_acceptance_rate == pytest.approx(0.5)
    assert view.spec_decode_acceptance_length == pytest.approx(2.5)
    off = metrics.server_view(PROM_BEFORE, PROM_BEFORE)
    assert not off.spec_decode and off.spec_decode_acceptance_rate is None


def _point(pid: str, **fig: float) -> dict:
    base = {"id": pid, "profile": "sweep", "kind": "concurrency", "input_len": 128, "output_len": 16,
            "concurrency": 1, "num_prompts": 4}
    return {**base, "figures": {**figures(RAW), **fig}}


def test_thresholds_select_points_and_can_fail():
    points = [_point("a", tokens_per_user=60.0), {**_point("b", tokens_per_user=40.0), "concurrency": 8}]
    ok, missing = check_thresholds(points, [{"name": "ss", "profile": "sweep", "concurrency": 1,
                                             "figure": "tokens_per_user", "min": 50, "min_spec_decode": 90}], False)
    assert [c.ok for c in ok] == [True] and not missing
    spec, _ = check_thresholds(points, [{"name": "ss", "concurrency": 1, "figure": "tokens_per_user", "min": 50,
                                         "min_spec_decode": 90}], True)
    assert [c.ok for c in spec] == [False] and "want >= 90" in spec[0].line()
    every, _ = check_thresholds(points, [{"figure": "tokens_per_user", "min": 50}], False)
    assert [c.ok for c in every] == [True, False]
    _, missing = check_thresholds(points, [{"name": "agg", "concurrency": 64, "figure": "output_throughput",
                                            "min": 1100}], False)
    assert missing == ["agg: no point of this run matches concurrency=64"]
    with pytest.raises(ReportError, match="figure is 'speed'"):
        check_thresholds(points, [{"figure": "speed", "min": 1}], False)


def test_regression_both_directions():
    old = [_point("a", output_throughput=100.0, p50_tpot_ms=10.0)]
    same = check_regression([_point("a", output_throughput=95.0, p50_tpot_ms=10.5)], old, 10,
                            ["output_throughput", "p50_tpot_ms"])
    assert all(c.ok for c in same)
    worse = check_regression([_point("a", output_throughput=80.0, p50_tpot_ms=12.0)], old, 10,
                             ["output_throughput", "p50_tpot_ms"])
    assert [c.ok for c in worse] == [False, False]


def _run_dir(root: Path, name: str) -> Path:
    run = root / "host" / name
    (run / "raw").mkdir(parents=True)
    plan = {"max_model_len": 4096, "skipped": [{"id": "long-x", "reason": "too long"}], "points": []}
    for pid, kind, conc, inp in [("sweep-c1", "concurrency", 1, 128), ("sweep-c4", "concurrency", 4, 128),
                                 ("context-512", "context", 1, 512), ("context-128", "context", 1, 128)]:
        plan["points"].append({"id": pid, "profile": pid.split("-")[0], "kind": kind, "input_len": inp,
                               "output_len": 16, "concurrency": conc, "num_prompts": 4})
        raw = dict(RAW)
        raw["output_throughput"] = 100.0 * conc
        raw["p50_tpot_ms"] = 5.0 + inp / 128
        (run / "raw" / f"{pid}.json").write_text(json.dumps(raw))
    (run / "plan.json").write_text(json.dumps(plan))
    (run / "metrics-before.prom").write_text(PROM_BEFORE)
    (run / "metrics-after.prom").write_text(PROM_AFTER)
    return run


def test_build_writes_report_plots_and_a_verdict(tmp_path):
    from PIL import Image

    first = _run_dir(tmp_path, "20260101T000000Z")
    verdict, summary = build(first, [{"figure": "failed", "max": 0}], 10, ["output_throughput"])
    assert verdict.ok and verdict.previous_run is None
    report = (first / "report.md").read_text()
    assert "| sweep-c4 | 128 | 16 | 4 |" in report and "skipped long-x: too long" in report
    assert "prefix-cache hit rate | 25.0 %" in report and "acceptance rate 50.0 %" in report
    for png in ("throughput_vs_concurrency.png", "tpot_vs_context.png"):
        with Image.open(first / png) as img:
            assert img.format == "PNG" and img.size[0] > 300
    assert summary["plots"]["throughput_vs_concurrency.png"] == {"vLLM": [[1.0, 100.0], [4.0, 400.0]]}
    assert summary["plots"]["tpot_vs_context.png"] == {"vLLM": [[128.0, 6.0], [512.0, 9.0]]}

    # The next run of the same host is compared with it: a throughput 30 % lower fails.
    second = _run_dir(tmp_path, "20260102T000000Z")
    slower = json.loads((second / "raw" / "sweep-c4.json").read_text())
    slower["output_throughput"] = 280.0
    (second / "raw" / "sweep-c4.json").write_text(json.dumps(slower))
    verdict, _ = build(second, [], 10, ["output_throughput"])
    assert not verdict.ok and verdict.previous_run == first.name
    assert verdict.failures == [
        "FAIL regression vs previous (400.00) [sweep-c4] output_throughput 280.00 (want >= 360)"
    ]


def test_build_refuses_a_missing_result(tmp_path):
    run = _run_dir(tmp_path, "20260101T000000Z")
    (run / "raw" / "sweep-c4.json").unlink()
    with pytest.raises(ReportError, match=r"sweep-c4\.json: missing"):
        build(run, [], 10, [])
    shutil.rmtree(run)
