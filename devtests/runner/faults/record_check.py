"""Test helper, run with a venv's python inside the test container: every file that
every installed distribution's RECORD lists is there with the RECORD's sha256 (nothing
half-installed). Prints the number of files checked, or the mismatches."""

import base64
import csv
import hashlib
import sys
import sysconfig
from pathlib import Path

site = Path(sysconfig.get_paths()["purelib"])
checked, bad = 0, []
for record in site.glob("*.dist-info/RECORD"):
    for row in csv.reader(record.read_text().splitlines()):
        if len(row) != 3 or not row[1].startswith("sha256="):
            continue
        path = (site / row[0]).resolve()
        try:
            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        except OSError:
            bad.append(row[0])
            continue
        checked += 1
        if row[1] != "sha256=" + digest:
            bad.append(row[0])
print(f"checked {checked}" if not bad else "bad " + " ".join(bad[:20]))
sys.exit(1 if bad else 0)
