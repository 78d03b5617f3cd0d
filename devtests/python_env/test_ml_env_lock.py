"""Unit tests of the ml_env lock filters, against the committed locks too."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ml_env_lock import FilterModule, ml_env_lock_pins, ml_env_pin_problems, ml_env_venv_name, ml_env_venvs_to_prune

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
    assert set(FilterModule().filters()) == {
        "ml_env_lock_pins", "ml_env_venv_name", "ml_env_pin_problems", "ml_env_venvs_to_prune"
    }


ROOT = "/opt/ml-envs"
A, B, C, D = (f"{ROOT}/ml-env-{c * 12}" for c in "abcd")


def _markers(*venvs: str) -> list[dict[str, object]]:
    """find results of completion markers, the first venv the oldest."""
    return [{"path": f"{v}/.glm5-lock.sha256", "mtime": 1000.0 + i} for i, v in enumerate(venvs)]


def test_pin_problems_default_requirements():
    required = {"vllm": "0.20.2", "torch": ""}
    assert ml_env_pin_problems({"vllm": "0.20.2", "torch": "2.11.0"}, required) == []
    assert ml_env_pin_problems({"vllm": "0.20.1", "torch": "2.11.0"}, required) == [
        "vllm is pinned to 0.20.1, 0.20.2 is required"
    ]
    assert ml_env_pin_problems({"six": "1.16.0"}, required) == ["vllm is not pinned", "torch is not pinned"]


def test_pin_problems_other_packages_and_names_normalised():
    assert ml_env_pin_problems({"huggingface-hub": "0.36.2"}, {"Huggingface_Hub": ""}) == []
    assert ml_env_pin_problems({"six": "1.16.0"}, {}) == []
    with pytest.raises(TypeError):
        ml_env_pin_problems({}, ["vllm"])


def test_prune_keeps_current_and_previous_over_newer():
    # The link went A -> B (previous A); C is a newer complete venv (built, then
    # rolled back from). Keeping the two newest would delete A, the one to roll back to.
    venvs = [A, B, C]
    assert ml_env_venvs_to_prune(venvs, _markers(A, B, C), B, A, 2) == [C]


def test_prune_removes_half_built_venvs():
    # D has no marker (a build that stopped): it goes, the previous A stays.
    venvs = [A, B, D]
    assert ml_env_venvs_to_prune(venvs, _markers(A, B), B, A, 2) == [D]


def test_prune_current_being_built_is_kept():
    assert ml_env_venvs_to_prune([A, B], _markers(A), B, A, 2) == []


def test_prune_without_previous_keeps_newest_complete():
    venvs = [A, B, C, D]
    assert ml_env_venvs_to_prune(venvs, _markers(A, B, C, D), D, "", 2) == [A, B]
    assert ml_env_venvs_to_prune(venvs, _markers(A, B, C, D), D, "", 3) == [A]


def test_prune_keep_one_removes_the_previous_too():
    assert ml_env_venvs_to_prune([A, B], _markers(A, B), B, A, 1) == [A]
    with pytest.raises(ValueError):
        ml_env_venvs_to_prune([A], _markers(A), A, "", 0)
