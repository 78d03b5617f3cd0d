#!/usr/bin/env python3
"""Disable PCIe ACS on the bridges above the NVIDIA GPUs (boot-time oneshot).

ACS (Access Control Services) on a PCIe switch or root port redirects
peer-to-peer traffic between GPUs up to the root complex, where the IOMMU may
drop or slow it; NCCL then hangs or runs at a fraction of its bandwidth.
This walks sysfs from each NVIDIA display/3D controller up to its root port
and clears the ACS control register of every bridge on the way with setpci.
The setting does not survive a reboot, hence a boot-time unit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
ACS_CTRL = "ECAP_ACS+0x6.w"

Runner = Callable[[list[str]], tuple[int, str]]


def _run(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def nvidia_gpus(sysfs: Path) -> list[Path]:
    """The sysfs device directories of the NVIDIA GPUs, resolved."""
    found = []
    devices = sysfs / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return []
    for dev in sorted(devices.iterdir()):
        try:
            vendor = (dev / "vendor").read_text().strip()
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA and cls[:6] in GPU_CLASSES:
            found.append(dev.resolve())
    return found


def bridges_above(gpus: list[Path]) -> list[str]:
    """The PCI addresses of every bridge between the GPUs and their root complex."""
    bridges: set[str] = set()
    for gpu in gpus:
        for parent in gpu.parents:
            if BDF.fullmatch(parent.name):
                bridges.add(parent.name)
            else:
                break  # reached pciDDDD:BB, the host bridge
    return sorted(bridges)


def disable_acs(bridges: list[str], setpci: str, run: Runner, dry_run: bool) -> list[str]:
    """Clear ACS control on each bridge that has the capability; return those changed."""
    changed = []
    for bdf in bridges:
        rc, value = run([setpci, "-s", bdf, ACS_CTRL])
        if rc != 0:
            continue  # no ACS capability on this bridge
        if value.strip().lower() == "0000":
            continue
        if dry_run:
            print(f"would clear ACS on {bdf} (control {value})")
            changed.append(bdf)
            continue
        rc, out = run([setpci, "-s", bdf, f"{ACS_CTRL}=0000"])
        if rc != 0:
            raise RuntimeError(f"setpci on {bdf} failed: {out}")
        rc, after = run([setpci, "-s", bdf, ACS_CTRL])
        if rc != 0 or after.strip().lower() != "0000":
            raise RuntimeError(f"ACS control on {bdf} still {after!r} after clearing")
        print(f"cleared ACS on {bdf} (was {value})")
        changed.append(bdf)
    return changed


def main(argv: list[str] | None = None, run: Runner = _run) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"))
    parser.add_argument("--setpci", default="setpci")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    gpus = nvidia_gpus(args.sysfs)
    bridges = bridges_above(gpus)
    print(f"{len(gpus)} NVIDIA GPU(s), {len(bridges)} bridge(s) above them")
    try:
        disable_acs(bridges, args.setpci, run, args.dry_run)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
