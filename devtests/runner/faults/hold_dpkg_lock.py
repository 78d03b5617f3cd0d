"""Test helper, run inside the test container: holds dpkg's frontend lock the way apt
and dpkg take it (fcntl write lock on /var/lib/dpkg/lock-frontend) until SECONDS
passed or it is killed; writes its pid to /root/dpkg-lock-holder once it holds it."""

import fcntl
import os
import sys
import time
from pathlib import Path

with Path("/var/lib/dpkg/lock-frontend").open("a") as lock:
    fcntl.lockf(lock, fcntl.LOCK_EX)
    Path("/root/dpkg-lock-holder").write_text(f"{os.getpid()}\n")
    time.sleep(float(sys.argv[1]))
