"""Check an ml-env against its lock; print a JSON report. Runs with the venv's python.

Usage: python ml_env_verify.py LOCK_FILE [--imports] [--modules a,b,...] [--min-gpus N]
--imports imports the --modules (default torch,gguf,vllm). Exit status 0 when every
pinned version matches (and imports / GPUs are fine), 1 otherwise.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import re
import sys
import sysconfig
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    lock = argv[1]
    imports = "--imports" in argv
    min_gpus = int(argv[argv.index("--min-gpus") + 1]) if "--min-gpus" in argv else 0
    modules = argv[argv.index("--modules") + 1].split(",") if "--modules" in argv else ["torch", "gguf", "vllm"]
    pins: dict[str, str] = {}
    with Path(lock).open(encoding="utf-8") as handle:
        for raw in handle:
            match = PIN.match(raw.strip())
            if match:
                pins[norm(match.group(1))] = match.group(3)
    installed = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    mismatches = {
        name: {"lock": want, "installed": installed.get(name)}
        for name, want in pins.items()
        if installed.get(name) != want
    }
    report: dict[str, object] = {
        "python": sys.version.split()[0],
        "site_packages": sysconfig.get_paths()["purelib"],
        "pinned": len(pins),
        "mismatches": mismatches,
        "versions": {
            n: installed.get(n) for n in ("vllm", "torch", "gguf", "huggingface-hub", "flash-attn")
        },
    }
    ok = not mismatches
    if imports:
        imported = {}
        for module in filter(None, modules):
            try:
                mod = importlib.import_module(module)
                imported[module] = str(getattr(mod, "__version__", "?"))
            except Exception as exc:
                imported[module] = f"ERROR {type(exc).__name__}: {exc}"
                ok = False
        report["imported"] = imported
        if min_gpus > 0 and "torch" in sys.modules:
            torch = sys.modules["torch"]
            count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
            report["gpus"] = count
            if count < min_gpus:
                report["gpu_error"] = f"torch sees {count} GPUs, {min_gpus} required"
                ok = False
    report["ok"] = ok
    print(json.dumps(report, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
