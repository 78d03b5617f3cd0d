"""Correctness of the served model: greedy answers to fixed prompts, perplexity of a
fixed text, and the garbage detector (glm5_tools.probe), run on the managed host.

Needs a real vLLM serving the real model: skipped on hosts without a GPU and where
the unit runs vllm_probe_standin. The probe package is shipped to /opt/glm5-tools by
playbooks/verify.yml.
"""

from __future__ import annotations

import json
import shlex

import pytest

PROBE_DIR = "/opt/glm5-tools"


def test_correctness_probe(host, service):
    if not service.gpu_required:
        pytest.skip("no GPU on this host: no model is served (glm5_gpu_required: false)")
    if service.standin:
        pytest.skip("the unit runs vllm_probe_standin (test double), not a model")
    if not host.file(f"{PROBE_DIR}/glm5_tools/probe/__main__.py").exists:
        pytest.skip(f"probe not shipped to {PROBE_DIR} (run playbooks/verify.yml)")
    cmd = host.run(
        # printf is the shell's builtin: the key shows in no process list; quoted for any key.
        f"printf %s {shlex.quote(service.api_key)} | (IFS= read -r VLLM_API_KEY; export VLLM_API_KEY; "
        f"PYTHONPATH={PROBE_DIR} python3 -m glm5_tools.probe --base-url {service.base_url} "
        f"--model {service.name})"
    )
    report = json.loads(cmd.stdout)
    assert report["ok"], report["failures"]
