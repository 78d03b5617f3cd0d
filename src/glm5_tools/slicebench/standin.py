"""A stand-in for ``systemctl`` and ``systemd-run`` on a machine whose PID 1 is not systemd.

TEST DOUBLE at a boundary the GPU validation machine cannot provide: it runs Ubuntu
24.04 but not under systemd (docs/validation), while role bench (playbooks/bench.yml)
reads ``systemctl is-active`` of the service's unit before it sends load, and its
llama.cpp side-by-side stops the unit, starts ``llama-server`` with ``systemd-run`` and
starts the unit again (``ansible.builtin.systemd_service``, which reads ``systemctl
show``). tools/gpu/standin/ puts this first on PATH there, so the playbook runs
unchanged; nothing of the product uses it.

A unit is a registered command: ``register NAME --log FILE -- ARGV...`` (the serving
step registers the rendered ``vllm serve`` command line under the unit's name), or what
``systemd-run --unit=NAME ARGV...`` starts. Started units run in their own session
(``setsid``); ``stop`` sends SIGTERM to the session's process group, then SIGKILL after
``--timeout`` seconds, and waits until the group is gone (the GPU's memory is free
then). State lives in ``$GLM5_STANDIN_DIR`` (default /run/glm5-standin): NAME.json
(argv, environment, log) and NAME.pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 120.0


def state_dir() -> Path:
    return Path(os.environ.get("GLM5_STANDIN_DIR", "/run/glm5-standin"))


def _unit(name: str) -> str:
    return name[: -len(".service")] if name.endswith(".service") else name


def _spec_path(unit: str) -> Path:
    return state_dir() / f"{unit}.json"


def _pid_path(unit: str) -> Path:
    return state_dir() / f"{unit}.pid"


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader of our own still "exists": reap it if it is our child
    try:
        pid, _ = os.waitpid(pgid, os.WNOHANG)
        if pid == pgid:
            return _alive_after_reap(pgid)
    except ChildProcessError:
        pass
    return True


def _alive_after_reap(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def running_pid(unit: str) -> int | None:
    path = _pid_path(unit)
    if not path.is_file():
        return None
    pid = int(path.read_text().strip() or 0)
    return pid if pid > 0 and _alive(pid) else None


def register(unit: str, argv: list[str], log: str, env: dict[str, str] | None = None, transient: bool = False) -> None:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    spec = {"argv": argv, "log": log, "env": dict(os.environ if env is None else env), "transient": transient}
    path = _spec_path(unit)
    path.write_text(json.dumps(spec))
    path.chmod(0o600)  # the environment may hold the service's API key


def start(unit: str) -> int:
    if running_pid(unit) is not None:
        return 0
    path = _spec_path(unit)
    if not path.is_file():
        print(f"Failed to start {unit}.service: Unit {unit}.service not found.", file=sys.stderr)
        return 5
    spec: dict[str, Any] = json.loads(path.read_text())
    log = Path(spec["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(spec["argv"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=spec["env"], start_new_session=True)
    _pid_path(unit).write_text(f"{proc.pid}\n")
    return 0


def stop(unit: str, timeout: float = STOP_TIMEOUT_S) -> int:
    pid = running_pid(unit)
    if pid is not None:
        with_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pid):
            with_signal(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.2)
    _pid_path(unit).unlink(missing_ok=True)
    spec = _spec_path(unit)
    if spec.is_file() and json.loads(spec.read_text()).get("transient"):
        spec.unlink()
    return 0


def with_signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def show(unit: str) -> str:
    pid = running_pid(unit)
    loaded = _spec_path(unit).is_file()
    return "\n".join([
        f"Id={unit}.service",
        f"LoadState={'loaded' if loaded else 'not-found'}",
        f"ActiveState={'active' if pid else 'inactive'}",
        f"SubState={'running' if pid else 'dead'}",
        f"MainPID={pid or 0}",
        "UnitFileState=static" if loaded else "UnitFileState=",
    ]) + "\n"


def systemctl(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-")]
    if not args:
        print("systemctl (stand-in): a verb is needed", file=sys.stderr)
        return 1
    verb, units = args[0], [_unit(u) for u in args[1:]]
    if verb in ("daemon-reload", "daemon-reexec"):
        return 0
    if verb == "is-active":
        states = ["active" if running_pid(u) else "inactive" for u in units]
        if not {"--quiet", "-q"} & set(argv):
            print("\n".join(states))
        return 0 if states and all(s == "active" for s in states) else 3
    if verb == "show":
        sys.stdout.write("".join(show(u) for u in units))
        return 0
    if verb == "start":
        return max((start(u) for u in units), default=0)
    if verb == "stop":
        return max((stop(u) for u in units), default=0)
    if verb == "restart":
        for u in units:
            stop(u)
        return max((start(u) for u in units), default=0)
    if verb in ("is-enabled",):
        print("static")
        return 0
    print(f"systemctl (stand-in): verb {verb} is not supported", file=sys.stderr)
    return 1


def systemd_run(argv: list[str]) -> int:
    unit = ""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg.startswith("--unit="):
            unit = _unit(arg.split("=", 1)[1])
        elif arg in ("--unit", "-u"):
            i += 1
            unit = _unit(argv[i])
        i += 1
    cmd = argv[i:]
    if not unit or not cmd:
        print("systemd-run (stand-in): needs --unit=NAME and a command", file=sys.stderr)
        return 1
    log = str(state_dir() / f"{unit}.log")
    register(unit, cmd, log, transient=True)
    rc = start(unit)
    if rc == 0:
        print(f"Running as unit: {unit}.service", file=sys.stderr)
    return rc


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: standin systemctl|systemd-run|register ...", file=sys.stderr)
        return 2
    tool, rest = args[0], args[1:]
    if tool == "systemctl":
        return systemctl(rest)
    if tool == "systemd-run":
        return systemd_run(rest)
    if tool == "register":
        head, cmd = (rest[: rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
        ap = argparse.ArgumentParser(prog="standin register NAME --log FILE -- ARGV...")
        ap.add_argument("unit")
        ap.add_argument("--log", required=True)
        ns = ap.parse_args(head)
        if not cmd:
            ap.error("a command after --")
        register(_unit(ns.unit), cmd, ns.log)
        return 0
    print(f"standin: unknown tool {tool}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
