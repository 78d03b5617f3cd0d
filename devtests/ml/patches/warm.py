"""Fresh-interpreter runs for the ml tests, started from a warm interpreter.

Many checks here must run in a fresh interpreter: each imports vLLM from its own overlay
(overlay.py) with its own environment. Most of such a start is spent importing torch, its
compiler stack, sympy and transformers (some 12 of the 17 s an import of vLLM's GGUF layer
takes on a CI machine), and no overlay changes those. A server imports them once and forks
a child per run; the child takes the run's environment, working directory, path, argv and
output files, and runs the code as ``python -c CODE``, ``python -m MODULE`` or
``python SCRIPT`` would, exit status and uncaught exceptions included. The server never
imports vllm, so each child imports the vllm of its own overlay.

A warm run is the same as a fresh interpreter's where the server was started in the same
environment: a run whose environment differs from a running
server's in a variable that the per-run set below does not name (the preloaded modules may
have read it at import) gets a server of its own (at most MAX_SERVERS run at once). With
another interpreter than this one, or GLM5_WARM_PYTHON=0, a run is a plain subprocess.

usage (by the client below): python warm.py serve
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

# What the server imports before it forks: what an import of vLLM imports first and no
# overlay changes.
PRELOAD = ("torch", "torch._dynamo.convert_frame", "torch._inductor.compile_fx", "sympy", "transformers")
# Variables a run may set differently from its server's environment: read at run time by
# what the children import (vLLM, the project's checks), not by PRELOAD at import. Any
# other variable is part of a server's identity: runs that differ in one (Triton's
# TRITON_INTERPRET, read when triton.language is imported) get a server each.
PER_RUN = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST")
PER_RUN_PREFIXES = ("GLM5_", "VLLM_")
# at most this many servers at once (each holds the preloaded modules: 680 MB resident,
# 400 MB of it its own, measured): a
# run that needs another stops the one used least recently
MAX_SERVERS = 3
# the server's PYTHONPATH: a folder that does not exist, which marks the place
PYTHONPATH_MARK = "/nonexistent/glm5-warm-pythonpath"

_lock = threading.Lock()
_servers: dict[frozenset[tuple[str, str]], subprocess.Popen[str]] = {}
stats = {"warm": 0, "plain": 0, "servers": 0}


def _per_run(key: str) -> bool:
    return key in PER_RUN or key.startswith(PER_RUN_PREFIXES)


def identity(env: dict[str, str]) -> frozenset[tuple[str, str]]:
    """The part of env that a server's preloaded modules may have read: which server runs it."""
    return frozenset((k, v) for k, v in env.items() if not _per_run(k))


def _form(argv: list[str]) -> bool:
    """python -c CODE ..., python -m MODULE ... or python SCRIPT ..., with this python."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] in ("-c", "-m"):
        return len(argv) >= 3
    return not argv[1].startswith("-")


def _server(env: dict[str, str]) -> subprocess.Popen[str]:
    """The running server for env's identity, started if there is none; the least recently
    used ones stop to keep at most MAX_SERVERS."""
    key = identity(env)
    server = _servers.pop(key, None)
    if server is not None and server.poll() is not None:
        server = None
    while len(_servers) >= MAX_SERVERS:
        _stop([_servers.pop(next(iter(_servers)))])
    if server is None:
        server = _start(key)
    _servers[key] = server  # the most recently used last
    return server


def _start(key: frozenset[tuple[str, str]]) -> subprocess.Popen[str]:
    # PYTHONPATH_MARK stands where python puts a run's PYTHONPATH (after what .pth files
    # insert at the front): the child puts the run's entries there
    server_env = dict(key, PYTHONPATH=PYTHONPATH_MARK)
    log = tempfile.NamedTemporaryFile(prefix="glm5-warm-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log, env=server_env, text=True, cwd="/")
    log.close()
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise RuntimeError(f"warm interpreter did not start: see {log.name}")
    Path(log.name).unlink()  # what the server writes later goes with it
    stats["servers"] += 1
    return server


def _stop(servers: list[subprocess.Popen[str]] | None = None) -> None:
    servers = list(_servers.values()) if servers is None else servers
    for server in servers:
        if server.poll() is None:
            assert server.stdin is not None
            server.stdin.close()
    for server in servers:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


atexit.register(_stop)


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, capture_output=True,
    text=True, check=False), from a warm interpreter where that is the same."""
    run_env = dict(os.environ if env is None else env)
    if os.environ.get("GLM5_WARM_PYTHON", "1") != "0" and _form(argv):
        with _lock:
            stats["warm"] += 1
            return _run_warm(_server(run_env), argv, run_env, Path(cwd or Path.cwd()), timeout)
    stats["plain"] += 1
    return subprocess.run(argv, env=run_env, cwd=cwd, timeout=timeout, capture_output=True, text=True, check=False)


def _run_warm(
    server: subprocess.Popen[str], argv: list[str], env: dict[str, str], cwd: Path, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    assert server.stdin is not None and server.stdout is not None
    with tempfile.TemporaryDirectory(prefix="glm5-warm-run-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"argv": argv[1:], "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err),
                   "timeout": timeout}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("warm interpreter ended during a run")
        reply = json.loads(line)
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(argv, timeout or 0, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(argv, reply["rc"], stdout, stderr)


# --- the server ---------------------------------------------------------------------


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any], before: list[str], after: list[str]) -> None:
    """In the forked child: become the fresh interpreter the request describes; never returns.
    before, after: the server's sys.path (without its first entry) before and after the
    place of a run's PYTHONPATH."""
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, to in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, to)
        os.close(fd)
    argv: list[str] = request["argv"]
    pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    # sys.path[0] as python sets it: '' for -c, the working directory for -m, the script's folder
    first = "" if argv[0] == "-c" else str(Path.cwd()) if argv[0] == "-m" else str(Path(argv[0]).resolve().parent)
    sys.path[:] = [first, *before, *pythonpath, *after]
    importlib.invalidate_caches()
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    rc = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            main.__file__ = argv[0]
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        rc = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        rc = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as python does at exit: join non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(rc & 0xFF)


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    assert "vllm" not in sys.modules, "the warm interpreter must not import vllm"
    base_path = sys.path[1:]  # without this file's folder
    if PYTHONPATH_MARK not in base_path:
        raise RuntimeError(f"the server's PYTHONPATH is not {PYTHONPATH_MARK}")
    mark = base_path.index(PYTHONPATH_MARK)
    before, after = base_path[:mark], base_path[mark + 1 :]
    replies = sys.stdout
    print("ready", file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, before, after)
        deadline = None if request["timeout"] is None else time.monotonic() + float(request["timeout"])
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out}), file=replies, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        sys.exit(__doc__)
    serve()
