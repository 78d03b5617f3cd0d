"""Test helper, run inside the test container when the run starts its wait for dpkg's
lock: waits for the module's Python to start (a new /usr/bin/python3 process without
arguments: the pipelined module), lets it wait DELAY seconds, then ends the lock holder
HOLDER_PID (the lock goes with it) and writes /root/released."""

import os
import signal
import sys
import time
from pathlib import Path

holder, delay = int(sys.argv[1]), float(sys.argv[2])


def pythons() -> set[int]:
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = [a for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            except OSError:
                continue
            if argv == [b"/usr/bin/python3"]:
                found.add(int(proc.name))
    return found


before = pythons()
deadline = time.monotonic() + 300
while time.monotonic() < deadline and not (pythons() - before):
    time.sleep(0.05)
time.sleep(delay)
os.kill(holder, signal.SIGTERM)
Path("/root/released").write_text("released\n")
