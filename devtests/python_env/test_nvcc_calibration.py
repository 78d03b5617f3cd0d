"""Opt-in: the nvcc calibration of flash_attn_job_peak_mb (heavy: minutes, ~4 GiB).

Runs roles/flash_attn/files/nvcc_calibrate.sh on one flash-attn kernel for sm_120 and
checks the object holds sm_120 code only. Set GLM5_FLASH_ATTN_SRC to an unpacked
flash-attn 2.8.3 sdist and GLM5_TORCH_PYTHON to a python with torch; needs nvcc and
cuobjdump (CUOBJDUMP=...).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/flash_attn/files/nvcc_calibrate.sh"
SRC = os.environ.get("GLM5_FLASH_ATTN_SRC", "")
PY = os.environ.get("GLM5_TORCH_PYTHON", "")


@pytest.mark.skipif(
    not (SRC and PY), reason="heavy nvcc calibration: set GLM5_FLASH_ATTN_SRC and GLM5_TORCH_PYTHON"
)
def test_calibration_object_holds_sm120_only(tmp_path):
    proc = subprocess.run(
        ["bash", str(SCRIPT), SRC, PY, str(tmp_path), "120", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert "elf_archs=sm_120 " in line
    assert "ptx_entries=0" in line
    peak_kb = int(re.search(r"peak_rss_kb=(\d+)", line).group(1))
    default_mb = 4500
    assert peak_kb / 1024 <= default_mb, "flash_attn_job_peak_mb default is below the measured peak"


def test_calibration_script_is_bash_clean():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
