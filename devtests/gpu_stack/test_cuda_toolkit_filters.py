"""Unit tests of role cuda_toolkit's filters, including against the real ml-env lock."""

from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parents[2] / "roles/ml_env/files/locks/requirements-py3.12.txt"


def test_real_lock_is_cuda_13_0(cuda):
    text = LOCK.read_text()
    assert cuda.cuda_version_from_lock(text) == "13.0"
    assert cuda.torch_version_from_lock(text) == "2.11.0"


def test_lock_cu12_runtime_and_local_version(cuda):
    assert cuda.cuda_version_from_lock("nvidia-cuda-runtime-cu12==12.8.90 \\\n") == "12.8"
    assert cuda.cuda_version_from_lock("torch==2.7.1+cu128 \\\n") == "12.8"
    assert cuda.torch_version_from_lock("torch==2.7.1+cu128 \\\n") == "2.7.1"
    with pytest.raises(ValueError, match="neither"):
        cuda.cuda_version_from_lock("torch==2.7.1+cpu\n")
    with pytest.raises(ValueError):
        cuda.torch_version_from_lock("numpy==2.0\n")


def test_suffix_and_nvcc(cuda):
    assert cuda.cuda_package_suffix("13.0") == "13-0"
    assert cuda.cuda_package_suffix("12.8.1") == "12-8"
    with pytest.raises(ValueError):
        cuda.cuda_package_suffix("thirteen")
    out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert cuda.nvcc_release(out) == "13.0"
    assert cuda.nvcc_release("command not found") == ""


@pytest.mark.parametrize(("version", "branch"), [("13.0", 580), ("13.1", 580), ("12.8", 570), ("12.4", 525)])
def test_min_driver(cuda, version, branch):
    assert cuda.cuda_min_driver_branch(version) == branch


def test_min_cuda_for_cc(cuda):
    assert cuda.cuda_min_for_compute_capability("12.0") == "12.8"
    assert cuda.cuda_min_for_compute_capability("9.0") == "11.8"


def test_good_combination(cuda):
    assert cuda.cuda_combination_errors("13.0", "580", "13.0", "2.11.0", "12.0") == []


def test_cuda13_on_570_refused_naming_three_versions(cuda):
    errors = cuda.cuda_combination_errors("13.0", "570", "13.0", "2.11.0", "12.0")
    assert errors
    text = " ".join(errors)
    assert "CUDA toolkit 13.0" in text
    assert "driver branch 570" in text
    assert "torch 2.11.0" in text


def test_major_mismatch_refused(cuda):
    errors = cuda.cuda_combination_errors("12.8", "580", "13.0", "2.11.0", "12.0")
    assert any("differs from torch's CUDA major 13" in e for e in errors)


def test_sm120_needs_12_8(cuda):
    errors = cuda.cuda_combination_errors("12.6", "580", "12.6", "2.6.0", "12.0")
    assert any("needs CUDA 12.8" in e for e in errors)
    assert cuda.cuda_combination_errors("12.6", "580", "12.6", "2.6.0", "9.0") == []


def test_bad_branch(cuda):
    with pytest.raises(ValueError):
        cuda.cuda_combination_errors("13.0", "latest", "13.0", "2.11.0", "12.0")
