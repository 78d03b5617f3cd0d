"""Role vllm_service's GPU-facing defaults against what the GPU validation machine showed.

The records are gpu_records/ beside this file, from end-to-end run 3 (driver 580.159.04,
vLLM 0.20.2 patched, docs/validation/e2e_serving.md): the NVIDIA character-device groups of
/proc/devices there, and the startup logs of the four servers started with the unit's
command line. The post-deploy suite makes the same checks on a deployed GPU host
(tests/test_service.py); these keep the defaults honest in CI, where there is no GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "gpu_records"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm_service" / "defaults" / "main.yml").read_text())


def recorded_nvidia_groups() -> set[str]:
    text = (RESULTS / "machine.txt").read_text()
    block = text.split("--- /proc/devices", 1)[1]
    names = set()
    for line in block.splitlines()[1:]:
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            break
        names.add(parts[1])
    return names


def test_every_recorded_nvidia_group_is_allowed() -> None:
    groups = recorded_nvidia_groups()
    assert {"nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps"} <= groups
    missing = {g for g in groups if f"char-{g}" not in DEFAULTS["vllm_service_device_allow"]}
    assert not missing, f"DeviceAllow lacks {missing} (seen in /proc/devices on the GPU machine)"


def test_backend_regex_matches_recorded_startup_logs() -> None:
    regex = re.compile(DEFAULTS["vllm_service_backend_log_regex"])
    logs = sorted(RESULTS.glob("server-*.log"))
    assert logs
    for log in logs:
        text = log.read_text(errors="replace")
        if "Traceback" in text and "Application startup complete" not in text:
            continue  # a server that died before choosing a backend (run 3's BF16 GGUF)
        assert regex.search(text), f"{log.name}: no Triton MLA line for {regex.pattern}"
