#!/usr/bin/python
"""Ansible module: list NVIDIA GPUs from sysfs by PCI vendor id (no lspci needed)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_pci_gpus
short_description: List NVIDIA GPUs and NVSwitches from sysfs
description:
  - Reads C(/sys/bus/pci/devices/*/{vendor,device,class}) and returns the NVIDIA
    (vendor C(0x10de)) display controllers (PCI class C(0x03xx)) and bridges of
    class C(0x0680) (NVSwitch). Works where lspci is absent. Never changes anything.
options:
  sysfs_root:
    description: Root of the PCI device tree.
    type: path
    default: /sys/bus/pci/devices
author: glm5-deploy
"""

EXAMPLES = r"""
- name: Find NVIDIA GPUs
  nvidia_pci_gpus:
  register: preflight_pci
"""

RETURN = r"""
gpus:
  description: One entry per NVIDIA GPU, sorted by PCI address.
  type: list
  elements: dict
  returned: always
  sample: [{"address": "0000:17:00.0", "device": "0x2bb1", "class": "0x030200", "numa_node": 0}]
nvswitches:
  description: NVIDIA devices of PCI class 0x0680 (NVSwitch), sorted by address.
  type: list
  elements: dict
  returned: always
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"
NVSWITCH_CLASS_PREFIX = "0x0680"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip().lower()
    except OSError:
        return ""


def scan(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Return NVIDIA GPUs and NVSwitches found under a sysfs PCI devices directory."""
    gpus: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    if not root.is_dir():
        return {"gpus": gpus, "nvswitches": switches}
    for dev in sorted(root.iterdir()):
        if _read(dev / "vendor") != NVIDIA_VENDOR:
            continue
        pci_class = _read(dev / "class")
        numa = _read(dev / "numa_node")
        entry = {
            "address": dev.name,
            "device": _read(dev / "device"),
            "class": pci_class,
            "numa_node": int(numa) if numa.lstrip("-").isdigit() else -1,
        }
        if pci_class.startswith(DISPLAY_CLASS_PREFIX):
            gpus.append(entry)
        elif pci_class.startswith(NVSWITCH_CLASS_PREFIX):
            switches.append(entry)
    return {"gpus": gpus, "nvswitches": switches}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"sysfs_root": {"type": "path", "default": "/sys/bus/pci/devices"}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **scan(Path(module.params["sysfs_root"])))


if __name__ == "__main__":
    main()
