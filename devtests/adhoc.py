"""Run one of the roles' modules as Ansible runs it (ad hoc, against localhost), with role
glm5's module_utils on the path, and return its result."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_module(role: str, module: str, args: dict[str, Any], check: bool = False,
               timeout: int = 120) -> dict[str, Any]:
    """The module's result (with ``failed`` set when it failed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_MODULE_UTILS=":".join(str(p) for p in sorted((ROOT / "roles").glob("*/module_utils"))))
    cmd = [str(ROOT / ".venv" / "bin" / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
           "-e", f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}",
           "-M", str(ROOT / "roles" / role / "library"), "-m", module, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=timeout)
    out = json.loads(proc.stdout)
    result: dict[str, Any] = out["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result


def call_module(module: Any, args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    """Run a module's main() in this process (as Ansible would, minus the shipping), e.g. one
    loaded with load_file.load_role_module, and return its result: milliseconds instead of
    the seconds of run_module, for tests that run a module many times."""
    import contextlib
    import io

    from ansible.module_utils import basic

    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}
    basic._ANSIBLE_ARGS = json.dumps(payload).encode()
    basic._ANSIBLE_PROFILE = "legacy"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main()
    result: dict[str, Any] = json.loads(out.getvalue())
    return result
