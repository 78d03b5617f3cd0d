"""Unit tests of role rollback's decisions: only units that passed the readiness wait are
targets; done or re-armed; the unit's venv."""

from __future__ import annotations

import pytest
from rollback_plan import FilterModule, rollback_plan, rollback_unit_venv, unit_digest

ROOT = "/opt/ml-envs"
A, B, C = (f"{ROOT}/ml-env-{c * 12}" for c in "abc")


def markers(*venvs: str) -> list[dict[str, object]]:
    """find results for the completion markers, the first venv the oldest."""
    return [{"path": f"{v}/.glm5-lock.sha256", "mtime": 1000.0 + i} for i, v in enumerate(venvs)]


def unit(venv: str, port: int = 8000) -> str:
    return f'[Service]\nEnvironment="GLM5_ML_ENV={venv}"\nExecStart=/opt/ml-env/bin/vllm serve --port {port}\n'


GOOD_A, GOOD_B, BAD_B = unit(A), unit(B), unit(B, 22)


def test_after_a_failed_run_the_last_good_unit_not_the_failed_one():
    # A passed, then a run with port 22 failed at the readiness wait: records untouched.
    plan = rollback_plan(BAD_B, GOOD_A, None, markers(A, B), current_venv=B, state={})
    assert plan["target"] == "good" and plan["unit"] == GOOD_A and plan["venv"] == A
    assert plan["error"] == "" and plan["done"] is False


def test_after_a_failed_then_a_good_run_the_one_before_the_good_one():
    # A passed, B with port 22 failed, B passed: .good = B, .previous = A (never the bad one).
    plan = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(A, B), current_venv=B, state={})
    assert plan["target"] == "previous" and plan["unit"] == GOOD_A and plan["venv"] == A


def test_unit_only_rollback_leaves_the_venv():
    plan = rollback_plan(unit(A, 9000), unit(A, 9000), GOOD_A, markers(A), current_venv=A, state={})
    assert plan["target"] == "previous" and plan["unit"] == GOOD_A and plan["venv"] == ""
    assert plan["record"]["from"] == plan["record"]["to"] == A


def test_venv_moved_without_a_deploy_goes_back_to_the_last_good_one():
    # ml_env moved the link to B; the unit (A's) passed on A.
    plan = rollback_plan(GOOD_A, GOOD_A, None, markers(A, B), current_venv=B, state={})
    assert plan["target"] == "good" and plan["venv"] == A


def test_refused_when_nothing_passed():
    plan = rollback_plan(BAD_B, None, None, markers(A, B), current_venv=B, state={})
    assert plan["target"] == "" and "no unit has passed the readiness wait" in plan["error"]


def test_refused_when_only_the_unit_in_place_passed():
    plan = rollback_plan(GOOD_B, GOOD_B, None, markers(A, B), current_venv=B, state={})
    assert plan["target"] == "" and "none passed before it" in plan["error"]


def test_refused_when_the_good_units_venv_was_pruned():
    plan = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(B), current_venv=B, state={})
    assert plan["target"] == "" and A in plan["error"] and "no longer a complete venv" in plan["error"]


def test_foreign_directories_are_not_venvs():
    found = [{"path": f"{ROOT}/scratch/.glm5-lock.sha256", "mtime": 1.0}]
    scratch = unit(f"{ROOT}/scratch")
    plan = rollback_plan(GOOD_B, GOOD_B, scratch, [*found, *markers(B)], current_venv=B, state={})
    assert plan["target"] == ""


def test_done_after_a_rollback_to_the_previous_one():
    plan = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(A, B), current_venv=B, state={})
    # The role then writes unit = A, .good = A, .previous = B and the record.
    again = rollback_plan(GOOD_A, GOOD_A, GOOD_B, markers(A, B), current_venv=A, state=plan["record"])
    assert again["done"] is True


def test_done_after_a_rollback_to_the_last_good_one():
    plan = rollback_plan(BAD_B, GOOD_A, None, markers(A, B), current_venv=B, state={})
    again = rollback_plan(GOOD_A, GOOD_A, None, markers(A, B), current_venv=A, state=plan["record"])
    assert again["done"] is True


def test_rearmed_by_a_later_good_deploy():
    record = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(A, B), current_venv=B, state={})["record"]
    # After the rollback to A, B is deployed again and passes: .good = B, .previous = A.
    plan = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(A, B), current_venv=B, state=record)
    assert plan["done"] is False and plan["target"] == "previous"


def test_rearmed_by_a_later_failed_deploy():
    record = rollback_plan(BAD_B, GOOD_A, None, markers(A, B), current_venv=B, state={})["record"]
    plan = rollback_plan(BAD_B, GOOD_A, None, markers(A, B), current_venv=B, state=record)
    assert plan["done"] is False and plan["target"] == "good"


def test_record_in_an_unknown_format_is_no_record():
    plan = rollback_plan(GOOD_B, GOOD_B, GOOD_A, markers(A, B), current_venv=B, state="x")
    assert plan["done"] is False and plan["target"] == "previous"


def test_unit_digest():
    assert unit_digest(None) == ""
    assert unit_digest("x") == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"


@pytest.mark.parametrize(
    ("text", "venv"),
    [
        (f'[Service]\nEnvironment="CUDA_HOME=/usr/local/cuda"\nEnvironment="GLM5_ML_ENV={A}"\n', A),
        (f"[Service]\nEnvironment=GLM5_ML_ENV={B}\n", B),
        ('[Service]\nEnvironment="CUDA_HOME=/usr/local/cuda"\n', ""),
        (f'# Environment="GLM5_ML_ENV={A}"\n', ""),
        ("", ""),
    ],
)
def test_unit_venv(text, venv):
    assert rollback_unit_venv(text) == venv


def test_filters_registered():
    assert set(FilterModule().filters()) == {"rollback_plan", "rollback_unit_venv", "rollback_unit_digest"}


def test_empty_text_is_an_absent_file():
    # The role passes the slurped texts; a missing file reads as "".
    assert rollback_plan(BAD_B, "", "", markers(A, B), current_venv=B, state={})["target"] == ""
    assert rollback_plan(BAD_B, GOOD_A, "", markers(A, B), current_venv=B, state={})["target"] == "good"
