"""Role vllm_service's argcheck request (vllm_service_argcheck_request) as the role
computes it from its defaults and vars and the given facts, rendered by ansible itself.
Shared by devtests/ml/service (unpatched vLLM, dense) and devtests/ml/patches (the
patched tree, the sparse default)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"


def argcheck_request(facts: dict[str, Any]) -> dict[str, Any]:
    cmd = [
        str(ANSIBLE),
        "localhost",
        "-c",
        "local",
        "-i",
        "localhost,",
        "-o",
        "-m",
        "ansible.builtin.debug",
        "-a",
        "var=vllm_service_argcheck_request",
        "-e",
        "@roles/glm5/defaults/main/site.yml",
        "-e",
        "@roles/vllm_service/defaults/main.yml",
        "-e",
        "@roles/vllm_service/vars/main.yml",
        "-e",
        json.dumps(facts),
    ]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CACHE_PLUGIN": "memory"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    request = json.loads(out.split("=>", 1)[1])["vllm_service_argcheck_request"]
    assert isinstance(request, dict)
    return request
