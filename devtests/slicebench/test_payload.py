"""glm5_tools.slicebench.payload: the pins of what the GPU machine is carried, from the locks."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm5_tools.slicebench import payload

REPO = Path(__file__).resolve().parents[2]
ML_LOCK = REPO / "roles" / "ml_env" / "files" / "locks" / "requirements-py3.12.txt"
TOOLS_LOCK = REPO / "requirements" / "tools.txt"


def test_the_locked_vllm_and_its_hashes():
    (line,) = payload.pins(ML_LOCK, ["vllm"])
    assert line.startswith("vllm==0.20.2 --hash=sha256:")
    assert line.count("--hash=sha256:") >= 1


def test_markers_pick_the_pin_for_python_3_12():
    versions = dict(line.split(" ")[0].split("==") for line in payload.pins(TOOLS_LOCK, ["contourpy", "numpy"]))
    on_311 = dict(line.split(" ")[0].split("==") for line in payload.pins(TOOLS_LOCK, ["contourpy", "numpy"], "3.11"))
    assert versions != on_311  # the universal lock pins other versions below 3.12
    assert payload.pins(TOOLS_LOCK, ["Python_Dateutil"])[0].startswith("python-dateutil==")


def test_a_name_not_in_the_lock_is_refused():
    with pytest.raises(ValueError, match=r"not in requirements-py3\.12\.txt for Python 3\.12: no-such-package"):
        payload.pins(ML_LOCK, ["vllm", "no-such-package"])
