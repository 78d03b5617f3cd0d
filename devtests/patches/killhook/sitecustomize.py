"""Fault injection for the SIGKILL tests (test code, never shipped): loaded by a Python
started with this directory on PYTHONPATH, it sends SIGKILL to its own process at an
exact point, through an audit hook (PEP 578), so that the kernel ends the real module
there, as `kill -9` would:

  GLM5_KILL_AT=rename:N   just before the Nth rename of a file under GLM5_KILL_UNDER
                          (each file the module replaces or writes is one rename);
  GLM5_KILL_AT=spawn:WORD just before the process starts a program whose arguments
                          contain WORD (py_compile: the byte-compile step).

The variables are taken out of the environment when read, so the programs this process
starts do not inherit the fault. GLM5_KILL_MARK names a file written just before the
kill (the test's proof that the fault fired)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

_AT = os.environ.pop("GLM5_KILL_AT", "")
_UNDER = os.environ.pop("GLM5_KILL_UNDER", "")
_MARK = os.environ.pop("GLM5_KILL_MARK", "")
_seen = 0


def _kill(what: str) -> None:
    if _MARK:
        Path(_MARK).write_text(what + "\n", encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    global _seen
    kind, _, value = _AT.partition(":")
    if kind == "rename" and event == "os.rename":
        dst = os.fsdecode(args[1])
        if _UNDER and dst.startswith(_UNDER) and "__pycache__" not in dst:
            _seen += 1
            if _seen == int(value):
                _kill(f"rename {_seen}: {dst}")
    elif kind == "spawn" and event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        if any(value in os.fsdecode(a) for a in argv):
            _kill(f"spawn: {argv[:2]}")


if _AT:
    sys.addaudithook(_hook)
