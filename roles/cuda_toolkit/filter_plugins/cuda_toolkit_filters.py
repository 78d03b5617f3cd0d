"""Filters of role cuda_toolkit: read CUDA versions from the ml-env lock and from nvcc,
and decide whether a toolkit / driver / torch combination can work.
"""

from __future__ import annotations

import re
from typing import Any

# nvidia-cuda-runtime==13.0.96 (CUDA 13 wheels) or nvidia-cuda-runtime-cu12==12.8.90.
_RUNTIME_PIN = re.compile(
    r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)(?:\.[0-9.]+)?", re.MULTILINE | re.IGNORECASE
)
# torch==2.7.1+cu128 (a build from the PyTorch index).
_TORCH_PIN = re.compile(r"^torch==([0-9][0-9a-z.]*)(?:\+(cu\d+|cpu))?", re.MULTILINE)
# "Cuda compilation tools, release 13.0, V13.0.88"
_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")

# Lowest driver branch each CUDA toolkit release needs (NVIDIA's CUDA release notes,
# table "CUDA Toolkit and Corresponding Driver Versions"; minor-version
# compatibility is not relied on: the toolkit's own driver requirement is used).
_MIN_DRIVER_BRANCH: list[tuple[tuple[int, int], int]] = [
    ((13, 0), 580),
    ((12, 8), 570),
    ((12, 0), 525),
    ((11, 0), 450),
]
# Lowest CUDA release that can build for a compute capability (sm_XY).
_MIN_CUDA_FOR_CC: list[tuple[tuple[int, int], tuple[int, int]]] = [
    ((12, 0), (12, 8)),
    ((10, 0), (12, 8)),
    ((9, 0), (11, 8)),
    ((8, 9), (11, 8)),
    ((8, 0), (11, 0)),
]


class FilterError(ValueError):
    """Raised on input the filters cannot make sense of."""


def _mm(value: Any, what: str = "version") -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.[0-9]+)*", str(value).strip())
    if not match:
        raise FilterError(f"not a {what} of the form major.minor: {value!r}")
    return int(match.group(1)), int(match.group(2) or 0)


def cuda_version_from_lock(text: str) -> str:
    """The CUDA major.minor the lock's torch is built for.

    Read from the pinned nvidia-cuda-runtime wheel (PyPI's torch builds), or from
    torch's local version (+cu128) when the lock pins a PyTorch-index build.
    """
    runtime = _RUNTIME_PIN.search(text)
    if runtime:
        return f"{int(runtime.group(1))}.{int(runtime.group(2))}"
    torch = _TORCH_PIN.search(text)
    if torch and torch.group(2) and torch.group(2).startswith("cu"):
        digits = torch.group(2)[2:]
        return f"{int(digits[:-1])}.{int(digits[-1])}"
    raise FilterError(
        "cuda_version_from_lock: the lock pins neither nvidia-cuda-runtime nor a +cuXYZ torch"
    )


def torch_version_from_lock(text: str) -> str:
    """The torch version the lock pins ("2.11.0")."""
    torch = _TORCH_PIN.search(text)
    if not torch:
        raise FilterError("torch_version_from_lock: the lock pins no torch")
    return torch.group(1)


def cuda_package_suffix(version: Any) -> str:
    """Map "13.0" to "13-0", the suffix of NVIDIA's cuda-toolkit-X-Y package."""
    major, minor = _mm(version, "CUDA version")
    return f"{major}-{minor}"


def nvcc_release(text: str) -> str:
    """The release ("13.0") that `nvcc --version` reports; "" if none."""
    match = _NVCC_RELEASE.search(text)
    return f"{int(match.group(1))}.{int(match.group(2))}" if match else ""


def cuda_min_driver_branch(version: Any) -> int:
    """The lowest driver branch a CUDA toolkit release runs on."""
    mm = _mm(version, "CUDA version")
    for since, branch in _MIN_DRIVER_BRANCH:
        if mm >= since:
            return branch
    raise FilterError(f"cuda_min_driver_branch: CUDA {version} is older than this table knows")


def cuda_min_for_compute_capability(cc: Any) -> str:
    """The lowest CUDA release that can build for compute capability `cc`."""
    mm = _mm(cc, "compute capability")
    for since, cuda in _MIN_CUDA_FOR_CC:
        if mm >= since:
            return f"{cuda[0]}.{cuda[1]}"
    return "11.0"


def cuda_combination_errors(
    toolkit: Any, driver_branch: Any, torch_cuda: Any, torch_version: Any, min_cc: Any
) -> list[str]:
    """Why a toolkit / driver / torch combination cannot work; [] when it can.

    - nvcc's major version must equal torch's CUDA major (torch's extension build
      refuses a mismatch, so flash-attn could not be built);
    - the driver branch must be at least the toolkit's and torch's CUDA requirement;
    - the toolkit must be able to build for the lowest compute capability accepted.
    """
    errors: list[str] = []
    tk = _mm(toolkit, "CUDA toolkit version")
    tc = _mm(torch_cuda, "torch CUDA version")
    branch_text = str(driver_branch).strip()
    if not branch_text.isdigit():
        raise FilterError(f"not a driver branch: {driver_branch!r}")
    branch = int(branch_text)
    names = (
        f"(CUDA toolkit {tk[0]}.{tk[1]}, driver branch {branch}, "
        f"torch {torch_version} built for CUDA {tc[0]}.{tc[1]})"
    )
    if tk[0] != tc[0]:
        errors.append(
            f"nvcc's major version {tk[0]} differs from torch's CUDA major {tc[0]}: torch's "
            f"extension build (flash-attn) refuses that {names}"
        )
    for label, mm in (("CUDA toolkit", tk), ("torch's CUDA", tc)):
        need = cuda_min_driver_branch(f"{mm[0]}.{mm[1]}")
        if branch < need:
            errors.append(f"{label} {mm[0]}.{mm[1]} needs driver branch {need} or newer {names}")
    need_cuda = _mm(cuda_min_for_compute_capability(min_cc))
    if tk < need_cuda:
        errors.append(
            f"compute capability {min_cc} (sm_{str(min_cc).replace('.', '')}) needs CUDA "
            f"{need_cuda[0]}.{need_cuda[1]} or newer {names}"
        )
    return errors


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "cuda_version_from_lock": cuda_version_from_lock,
            "torch_version_from_lock": torch_version_from_lock,
            "cuda_package_suffix": cuda_package_suffix,
            "nvcc_release": nvcc_release,
            "cuda_min_driver_branch": cuda_min_driver_branch,
            "cuda_min_for_compute_capability": cuda_min_for_compute_capability,
            "cuda_combination_errors": cuda_combination_errors,
        }
