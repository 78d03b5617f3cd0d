"""Patch 0005: vLLM's engine setup must not ask transformers to parse a local GLM-5 GGUF.

Found by the end-to-end run on the GPU machine (docs/validation/e2e_serving.md):
before any weight is loaded, EngineArgs.create_engine_config calls
maybe_override_with_speculators, which hands a local .gguf file to transformers;
the pinned transformers 4.57.6 cannot read architecture glm-dsa and vLLM stops
with "GGUF model with architecture glm-dsa is not supported yet", whatever
--hf-config-path says. Reproduced here on the CPU with the tiny GLM-5's GGUF.
"""

from __future__ import annotations

import overlay
import pytest
from roundtrip import HF_DIR, SPLIT_GGUF

PROBE = (
    "import sys\n"
    "from vllm.transformers_utils.config import maybe_override_with_speculators\n"
    "print(maybe_override_with_speculators(sys.argv[1], sys.argv[2], trust_remote_code=False))\n"
)


@pytest.fixture(scope="module")
def first_shard() -> str:
    if not SPLIT_GGUF:
        pytest.fail("tiny GLM-5 fixture missing: run scripts/make-tiny-glm5")
    return str(SPLIT_GGUF[0])


def test_speculators_probe_fails_without_0005(tmp_path, first_shard, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    without = [p for p in overlay.patches() if not p.name.startswith("0005-")]
    site = overlay.make_overlay(tmp_path / "site", without)
    proc = overlay.run_in(site, PROBE, first_shard, str(HF_DIR))
    assert proc.returncode != 0
    assert "glm-dsa" in proc.stderr


def test_speculators_probe_leaves_local_gguf_alone(first_shard, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.transformers_utils.config import maybe_override_with_speculators

    got = maybe_override_with_speculators(first_shard, str(HF_DIR), trust_remote_code=False)
    assert got == (first_shard, str(HF_DIR), None)
