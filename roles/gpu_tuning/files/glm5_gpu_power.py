#!/usr/bin/env python3
"""Apply and verify the GPU power limit, persistence mode and locked clocks.

Reads its settings from a JSON file rendered by the gpu_tuning role::

    {"persistence": true, "override_w": 0, "locked_clocks": "",
     "limits": [{"match": "Max-Q", "watts": 300}, ...]}

For each GPU the first ``limits`` entry whose ``match`` occurs in the GPU's
name gives the limit (``override_w`` > 0 wins over the table); a GPU that no
entry matches keeps its default. ``--check`` only verifies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUERY = "index,name,power.limit,power.max_limit,persistence_mode"
Runner = Callable[[list[str]], tuple[int, str]]


@dataclass
class Gpu:
    index: int
    name: str
    limit_w: float
    max_limit_w: float
    persistence: bool


def _run(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _watts(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # "[N/A]" on boards that do not report it


def parse_query(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        gpus.append(
            Gpu(
                index=int(fields[0]),
                name=fields[1],
                limit_w=_watts(fields[2]),
                max_limit_w=_watts(fields[3]),
                persistence=fields[4].lower() == "enabled",
            )
        )
    return gpus


def target_watts(name: str, config: dict[str, Any]) -> int:
    """The power limit for a GPU named ``name`` (0 = leave the default)."""
    override = int(config.get("override_w", 0))
    if override > 0:
        return override
    for entry in config.get("limits", []):
        if str(entry["match"]).lower() in name.lower():
            return int(entry["watts"])
    return 0


def query(smi: str, run: Runner) -> list[Gpu]:
    rc, out = run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"])
    if rc != 0:
        raise RuntimeError(f"nvidia-smi query failed: {out}")
    return parse_query(out)


def problems(gpus: list[Gpu], config: dict[str, Any]) -> list[str]:
    found = []
    for gpu in gpus:
        want = target_watts(gpu.name, config)
        if want and abs(gpu.limit_w - want) > 1.0:
            found.append(f"GPU {gpu.index} ({gpu.name}): power limit {gpu.limit_w} W, want {want} W")
        if config.get("persistence", True) and not gpu.persistence:
            found.append(f"GPU {gpu.index} ({gpu.name}): persistence mode off")
    return found


def apply(gpus: list[Gpu], config: dict[str, Any], smi: str, run: Runner) -> None:
    if config.get("persistence", True):
        rc, out = run([smi, "-pm", "1"])
        if rc != 0:
            raise RuntimeError(f"nvidia-smi -pm 1 failed: {out}")
    for gpu in gpus:
        want = target_watts(gpu.name, config)
        if want:
            if gpu.max_limit_w and want > gpu.max_limit_w:
                raise RuntimeError(f"GPU {gpu.index} ({gpu.name}): {want} W is above its maximum {gpu.max_limit_w} W")
            rc, out = run([smi, "-i", str(gpu.index), "-pl", str(want)])
            if rc != 0:
                raise RuntimeError(f"nvidia-smi -pl on GPU {gpu.index} failed: {out}")
        clocks = str(config.get("locked_clocks", ""))
        if clocks:
            rc, out = run([smi, "-i", str(gpu.index), "-lgc", clocks])
            if rc != 0:
                raise RuntimeError(f"nvidia-smi -lgc on GPU {gpu.index} failed: {out}")


def main(argv: list[str] | None = None, run: Runner = _run) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("/etc/glm5/gpu-power.json"))
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--check", action="store_true", help="verify only")
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    try:
        gpus = query(args.nvidia_smi, run)
        if not args.check:
            apply(gpus, config, args.nvidia_smi, run)
            gpus = query(args.nvidia_smi, run)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    bad = problems(gpus, config)
    for gpu in gpus:
        print(f"GPU {gpu.index} {gpu.name}: {gpu.limit_w} W, persistence {gpu.persistence}")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
