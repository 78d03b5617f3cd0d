"""Filters of role nvidia_driver: parse what nvidia-smi, the kernel and dkms report.

Each filter takes the text a command printed and returns plain data, so the
tasks decide on values, never on grep output.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from typing import Any

# Values nvidia-smi prints where a field has no value on this GPU.
_NO_VALUE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
_PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
_BARE_VERSION = re.compile(r"^\s*(\d+\.\d+(?:\.\d+)?)\s*$")

# PCI class of an NVSwitch: 0x0680 (bridge, other); NVIDIA's vendor id 0x10de.
_NVIDIA_VENDOR = "0x10de"
_NVSWITCH_CLASS_PREFIX = "0x0680"


class FilterError(ValueError):
    """Raised on input the filters cannot make sense of."""


def nvidia_smi_csv(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv,noheader[,nounits]`.

    Returns one dict per GPU, keyed by the query field names with "." replaced by
    "_" (mig.mode.current -> mig_mode_current, usable as a Jinja attribute); values nvidia-smi
    reports as not available become None. A line with the wrong number of
    columns is an error (it means the query and the field list disagree).
    """
    if not fields:
        raise FilterError("nvidia_smi_csv: the list of query fields is empty")
    rows: list[dict[str, str | None]] = []
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    for lineno, cols in enumerate(reader, start=1):
        if not cols or all(not c.strip() for c in cols):
            continue
        if len(cols) != len(fields):
            raise FilterError(
                f"nvidia_smi_csv: line {lineno} has {len(cols)} columns, "
                f"expected {len(fields)} ({', '.join(fields)}): {cols!r}"
            )
        row: dict[str, str | None] = {}
        for name, raw in zip(fields, cols, strict=True):
            value = raw.strip()
            row[name.replace(".", "_")] = None if value in _NO_VALUE else value
        rows.append(row)
    return rows


def nvidia_loaded_driver_version(text: str) -> str:
    """The driver version from /sys/module/nvidia/version or /proc/driver/nvidia/version.

    Returns "" when the text names no version (no driver loaded).
    """
    if not text:
        return ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    bare = _BARE_VERSION.match(first)
    if bare:
        return bare.group(1)
    found = _PROC_VERSION.search(text)
    return found.group(1) if found else ""


def nvidia_driver_branch_of(version: str) -> str:
    """The branch ("580") of a driver version ("580.159.04"); "" for ""."""
    version = str(version).strip()
    if not version:
        return ""
    major = version.split(".", 1)[0]
    if not major.isdigit():
        raise FilterError(f"nvidia_driver_branch_of: not a driver version: {version!r}")
    return major


def _cc_tuple(value: Any) -> tuple[int, int]:
    text = str(value).strip()
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?", text)
    if not match:
        raise FilterError(f"not a compute capability (major.minor): {text!r}")
    return int(match.group(1)), int(match.group(2) or 0)


def compute_capability_at_least(value: Any, minimum: Any) -> bool:
    """True when compute capability `value` ("9.0") is >= `minimum` ("12.0")."""
    return _cc_tuple(value) >= _cc_tuple(minimum)


def gpus_below_compute_capability(gpus: list[dict[str, Any]], minimum: Any) -> list[dict[str, Any]]:
    """The GPUs (rows of nvidia_smi_csv) whose compute_cap is unknown or below `minimum`."""
    low: list[dict[str, Any]] = []
    for gpu in gpus:
        cc = gpu.get("compute_cap")
        if cc is None or not compute_capability_at_least(cc, minimum):
            low.append(gpu)
    return low


def nvidia_nvswitch_count(text: str) -> int:
    """Count NVSwitch devices in lines of "<vendor> <class>" read from sysfs.

    Each line holds the contents of /sys/bus/pci/devices/*/vendor and .../class,
    e.g. "0x10de 0x068000".
    """
    count = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        vendor, pci_class = parts[0].lower(), parts[1].lower()
        if vendor == _NVIDIA_VENDOR and pci_class.startswith(_NVSWITCH_CLASS_PREFIX):
            count += 1
    return count


def dkms_missing_kernels(status: str, kernels: list[str], module: str = "nvidia") -> list[str]:
    """The kernels in `kernels` for which `dkms status` shows `module` not installed.

    Understands both output styles: "nvidia/580.95.05, 6.8.0-45-generic, x86_64: installed"
    (dkms 3) and "nvidia, 580.95.05, 6.8.0-45-generic, x86_64: installed" (dkms 2).
    """
    built: set[str] = set()
    for line in status.splitlines():
        head, sep, state = line.partition(":")
        if not sep or not state.strip().startswith("installed"):
            continue
        parts = [p.strip() for p in head.split(",")]
        name = parts[0].split("/", 1)[0]
        if name != module:
            continue
        if "/" in parts[0] and len(parts) >= 2:
            built.add(parts[1])
        elif len(parts) >= 3:
            built.add(parts[2])
    return [k for k in kernels if k not in built]


def kernel_flavour(release: str) -> str:
    """The flavour of an Ubuntu kernel release: "6.8.0-45-generic" -> "generic"."""
    match = re.fullmatch(r"\d+\.\d+\.\d+-\d+-([a-z0-9-]+)", release.strip())
    if not match:
        raise FilterError(f"kernel_flavour: cannot read a flavour from {release!r}")
    return match.group(1)


def _installed(dpkg_status: str | Mapping[str, Mapping[str, str]]) -> list[str]:
    """Names of the packages `dpkg-query -W -f='${Package} ${db:Status-Status}\\n'` shows installed,
    or, given role glm5's package state (fact glm5_dpkg, filter dpkg_state), those it lists
    with status installed."""
    if isinstance(dpkg_status, Mapping):
        return [name for name, entry in dpkg_status.items() if entry.get("status") == "installed"]
    names: list[str] = []
    for line in dpkg_status.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "installed":
            names.append(parts[0])
    return names


def precompiled_missing_kernels(dpkg_status: str, kernels: list[str], branch: str) -> list[str]:
    """The kernels in `kernels` without Ubuntu's signed open module package for `branch`.

    Ubuntu ships the pre-signed module of each kernel ABI as
    linux-modules-nvidia-<branch>-open-<kernel release>; a kernel without it boots
    with no nvidia module under Secure Boot.
    """
    installed = set(_installed(dpkg_status))
    return [k for k in kernels if f"linux-modules-nvidia-{branch}-open-{k}" not in installed]


def driver_hold_list(
    dpkg_status: str | Mapping[str, Mapping[str, str]], patterns: list[str], extra: list[str]
) -> list[str]:
    """The installed packages to hold: those matching one of `patterns` (regular
    expressions) and those named in `extra` (e.g. the kernel meta packages), sorted."""
    regex = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
    wanted = set(extra)
    return sorted(
        {name for name in _installed(dpkg_status) if name in wanted or (regex is not None and regex.match(name))}
    )


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_smi_csv": nvidia_smi_csv,
            "nvidia_loaded_driver_version": nvidia_loaded_driver_version,
            "nvidia_driver_branch_of": nvidia_driver_branch_of,
            "compute_capability_at_least": compute_capability_at_least,
            "gpus_below_compute_capability": gpus_below_compute_capability,
            "nvidia_nvswitch_count": nvidia_nvswitch_count,
            "dkms_missing_kernels": dkms_missing_kernels,
            "kernel_flavour": kernel_flavour,
            "precompiled_missing_kernels": precompiled_missing_kernels,
            "driver_hold_list": driver_hold_list,
        }
