"""Correctness probe for an OpenAI-compatible GLM-5 endpoint.

Shared by the post-deploy suite (tests/test_correctness.py) and the diagnostics
playbook. Pure Python (standard library HTTP), so it runs on a managed host without
extra packages. :mod:`.standin` is the *vLLM stand-in* used in containers, which have
no GPU; it is a test double, not a model.
"""

from glm5_tools.probe.checks import (
    FIXED_PROMPTS,
    PERPLEXITY_TEXT,
    FixedPrompt,
    ProbeReport,
    Verdict,
    assess_answer,
    perplexity_from_logprobs,
    run_probe,
)
from glm5_tools.probe.client import ApiClient, ApiError

__all__ = [
    "FIXED_PROMPTS",
    "PERPLEXITY_TEXT",
    "ApiClient",
    "ApiError",
    "FixedPrompt",
    "ProbeReport",
    "Verdict",
    "assess_answer",
    "perplexity_from_logprobs",
    "run_probe",
]
