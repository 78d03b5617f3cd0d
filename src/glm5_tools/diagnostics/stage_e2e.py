"""Stage 6: end to end, the post-deploy correctness probe against the running server."""

from __future__ import annotations

import os

from glm5_tools.diagnostics.result import StageResult, Verdict

STAGE = 6
NAME = "end to end (probe)"


def run_stage(base_url: str | None, model: str, api_key_env: str = "VLLM_API_KEY",
              perplexity_threshold: float = 20.0, timeout: float = 300.0) -> StageResult:
    if not base_url:
        return StageResult.skip(STAGE, NAME, "no --server-url given (no running server to probe)")
    from glm5_tools.probe.checks import run_probe
    from glm5_tools.probe.client import ApiClient, ApiError

    client = ApiClient(base_url, os.environ.get(api_key_env), timeout=timeout)
    try:
        report = run_probe(client, model, perplexity_threshold)
    except ApiError as exc:
        return StageResult(5, NAME, Verdict.FAIL, float("nan"),
                           perplexity_threshold, base_url, [f"server error: {exc}"])
    details = [f"{a['name']}: {a['verdict']} {a['answer'][:80]!r}" for a in report.answers]
    details.extend(report.failures)
    ppl = report.perplexity if report.perplexity is not None else float("nan")
    res = StageResult.judge(STAGE, NAME, ppl, perplexity_threshold, base_url, details)
    if report.failures:
        res.verdict = Verdict.FAIL
    return res
