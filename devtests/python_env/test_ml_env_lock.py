"""Unit tests of the ml_env lock filters, against the committed locks too."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ml_env_lock import FilterModule, ml_env_lock_pins, ml_env_venv_name

LOCKS = Path(__file__).resolve().parents[2] / "roles/ml_env/files/locks"
VERSIONS = Path(__file__).resolve().parents[2] / "roles/glm5/defaults/main/versions.yml"

SAMPLE = """# generated
aiohttp==3.14.5 \\
    --hash=sha256:0133
    # via vllm
Huggingface_Hub[hf_xet]==0.36.2 \\
    --hash=sha256:ab
torch==2.11.0 ; platform_machine == 'x86_64'
"""


def test_pins_parsed_and_normalised():
    assert ml_env_lock_pins(SAMPLE) == {
        "aiohttp": "3.14.5",
        "huggingface-hub": "0.36.2",
        "torch": "2.11.0",
    }


def test_unpinned_line_refused():
    with pytest.raises(ValueError, match="exact"):
        ml_env_lock_pins("vllm>=0.20\n")


def test_empty_lock_refused():
    with pytest.raises(ValueError, match="no packages"):
        ml_env_lock_pins("# nothing\n")


@pytest.mark.parametrize("lock", sorted(LOCKS.glob("requirements-py3.*.txt")), ids=lambda p: p.name)
def test_committed_locks_pin_the_project_versions(lock):
    pins = ml_env_lock_pins(lock.read_text(encoding="utf-8"))
    wanted = next(
        line.split(":", 1)[1].strip().strip('"')
        for line in VERSIONS.read_text(encoding="utf-8").splitlines()
        if line.startswith("glm5_vllm_version:")
    )
    assert pins["vllm"] == wanted
    assert pins["torch"].startswith("2.11.")
    assert pins["gguf"] == "0.19.0"
    assert "huggingface-hub" in pins
    assert "ninja" in pins  # flash-attn builds need it in the venv


def test_locks_agree_on_the_main_stack():
    p312 = ml_env_lock_pins((LOCKS / "requirements-py3.12.txt").read_text(encoding="utf-8"))
    p313 = ml_env_lock_pins((LOCKS / "requirements-py3.13.txt").read_text(encoding="utf-8"))
    for name in ("vllm", "torch", "gguf", "transformers", "huggingface-hub", "triton"):
        assert p312.get(name) == p313.get(name), name


def test_venv_name_from_digest():
    digest = hashlib.sha256(b"lock").hexdigest()
    assert ml_env_venv_name(digest) == "ml-env-" + digest[:12]


@pytest.mark.parametrize("bad", ["", "abc", "Z" * 64, None])
def test_venv_name_refuses_non_digest(bad):
    with pytest.raises(ValueError):
        ml_env_venv_name(bad)


def test_registered_as_filters():
    assert set(FilterModule().filters()) == {"ml_env_lock_pins", "ml_env_venv_name"}
