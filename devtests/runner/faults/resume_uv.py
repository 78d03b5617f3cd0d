"""Test helper, run inside the test container: waits until a run is waiting to remove
VENV (a `flock ... rm -rf VENV` process exists), lets it wait DELAY seconds more,
checks the stopped uv PIDS are still there, then lets them go on (SIGCONT), and
writes what it saw to OUT (json)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

venv, delay, out = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
pids = [int(p) for p in sys.argv[4].split(",") if p]


def waiting_remover() -> bool:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"flock") and b"rm" in argv and venv.encode() in argv:
            return True
    return False


deadline = time.monotonic() + 900
while time.monotonic() < deadline and not waiting_remover():
    time.sleep(0.05)
seen = waiting_remover()
time.sleep(delay)
alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
still_waiting = waiting_remover()
for pid in alive:
    os.kill(pid, signal.SIGCONT)
out.write_text(json.dumps({"remover_waited": seen and still_waiting, "uv_alive": alive}))
