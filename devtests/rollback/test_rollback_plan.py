"""Unit tests of role rollback's decisions: the target, done or re-armed, the unit's venv."""

from __future__ import annotations

import pytest
from rollback_plan import FilterModule, rollback_plan, rollback_unit_venv

ROOT = "/opt/ml-envs"
A, B, C = (f"{ROOT}/ml-env-{c * 12}" for c in "abc")


def markers(*venvs: str) -> list[dict[str, object]]:
    """find results for the completion markers, the first venv the oldest."""
    return [{"path": f"{v}/.glm5-lock.sha256", "mtime": 1000.0 + i} for i, v in enumerate(venvs)]


def test_target_is_the_recorded_previous_venv_not_the_newest():
    # C was built last but A is what ran before the link moved to B.
    plan = rollback_plan(markers(A, C, B), current=B, previous=A, state={})
    assert plan == {"done": False, "target": A}


def test_without_record_the_newest_other_complete_venv():
    assert rollback_plan(markers(A, B), current=B, previous="", state=None)["target"] == A


def test_incomplete_or_missing_previous_falls_back():
    # The recorded venv has no marker (removed by hand): the newest complete other one.
    assert rollback_plan(markers(C, B), current=B, previous=A, state={})["target"] == C


def test_nothing_to_roll_back_to():
    assert rollback_plan(markers(B), current=B, previous="", state={}) == {"done": False, "target": ""}


def test_foreign_directories_ignored():
    found = [*markers(A, B), {"path": f"{ROOT}/scratch/.glm5-lock.sha256", "mtime": 9999.0}]
    assert rollback_plan(found, current=B, previous="", state={})["target"] == A


def test_done_after_a_rollback():
    # After B -> A the role wrote previous = B and the record {from: B, to: A}.
    plan = rollback_plan(markers(A, B), current=A, previous=B, state={"from": B, "to": A})
    assert plan["done"] is True


def test_rearmed_by_an_upgrade_back_to_the_same_lock():
    # ml_env moved the link A -> B again and recorded previous = A.
    plan = rollback_plan(markers(A, B), current=B, previous=A, state={"from": B, "to": A})
    assert plan == {"done": False, "target": A}


def test_rearmed_by_an_upgrade_to_a_new_lock():
    # After the rollback to A, an upgrade to C: previous = A. The old rule ("done while
    # the link is not on the venv rolled back from") took this for done.
    plan = rollback_plan(markers(A, B, C), current=C, previous=A, state={"from": B, "to": A})
    assert plan == {"done": False, "target": A}


def test_rearmed_when_ml_env_moves_the_link_onto_the_old_target():
    # Rolled back B -> A, upgraded to C, then ml_env with A's lock: link on A again,
    # previous = C. Not the rollback on record: roll back to C.
    plan = rollback_plan(markers(A, B, C), current=A, previous=C, state={"from": B, "to": A})
    assert plan == {"done": False, "target": C}


def test_record_in_an_unknown_format_is_no_record():
    plan = rollback_plan(markers(A, B), current=B, previous=A, state=B)
    assert plan == {"done": False, "target": A}


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
    assert set(FilterModule().filters()) == {"rollback_plan", "rollback_unit_venv"}
