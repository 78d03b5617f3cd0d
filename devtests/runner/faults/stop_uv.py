"""Test helper, run inside the test container: waits until uv has begun to install
PACKAGE into the venv (its directory appears in SITE), then stops (SIGSTOP) every uv
process installing into VENV at once, mid-install, and writes what it saw to OUT
(json: the pids, the files of PACKAGE present, the dist-info directories present)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

site, package, venv, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])


def uv_pids() -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"/uv") and b"sync" in argv and any(venv.encode() in a for a in argv):
            found.append(int(proc.name))
    return found


deadline = time.monotonic() + 900
while time.monotonic() < deadline:
    if (site / package).is_dir():
        pids = uv_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        files = sum(len(f) for _d, _s, f in os.walk(site / package))
        infos = sorted(p.name for p in site.glob("*.dist-info"))
        out.write_text(json.dumps({"pids": pids, "files": files, "dist_infos": infos}))
        break
    time.sleep(0.002)
