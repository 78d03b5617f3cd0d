"""How far an apt install in flight is, read from what apt and dpkg record themselves.

Role glm5's tasks/apt.yml runs the apt module in the background and follows it in rounds
(tasks/follow.yml, module glm5_job_progress); each round reads, on the host:

  history.log   apt writes the block of a run when dpkg starts: ``Start-Date:``, then one
                line per operation (``Install: a:amd64 (1.0), b:amd64 (2.0, automatic)``),
                and ``End-Date:`` when dpkg has finished: the packages to be unpacked and
                set up, known before dpkg touches the first one
  term.log      dpkg's terminal output, as it runs, between ``Log started:`` and ``Log
                ended:`` (``Unpacking x (1.0) ...``, ``Setting up x (1.0) ...``, the
                maintainer scripts' own lines: a DKMS build of the driver's module)
  archives      the .deb files apt fetched (``/var/cache/apt/archives``) and the ones it is
                fetching (``partial/``): the bytes fetched so far
  lists         ``/var/lib/apt/lists/partial``: package lists being fetched (update_cache)

Only what this job did counts: blocks whose start stamp (local time, to the second) and
files whose ctime (a finished .deb is renamed into place) are not older than the job's
start. apt prints the totals of a download ("Need to get 1972 kB") only to its own
output, which the module hands back at the end; while it fetches, the bytes so far are
what there is. The document is put in words by module_utils/glm5_progress.py
(``describe``, kind ``apt``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

STAMP = r"(\d{4}-\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2})"
TERM_START = re.compile(rf"^Log started: {STAMP}\s*$", re.MULTILINE)
HISTORY_START = re.compile(rf"^Start-Date: {STAMP}\s*$", re.MULTILINE)
# history.log's operations: what dpkg unpacks and sets up, and what it removes.
INSTALLS = ("Install", "Upgrade", "Downgrade", "Reinstall")
REMOVALS = ("Remove", "Purge")
PACKAGE = re.compile(r"(\S+) \([^)]*\)")
UNPACKING = re.compile(r"^Unpacking (\S+) ", re.MULTILINE)
SETTING_UP = re.compile(r"^Setting up (\S+) ", re.MULTILINE)
REMOVING = re.compile(r"^Removing (\S+) ", re.MULTILINE)
# Lines of term.log that say nothing about where dpkg is.
NOISE = re.compile(r"^(\(Reading database|Log started:|Log ended:|debconf: )")
# apt-get's own summary lines, in the module's stdout at the end.
SUMMARY = re.compile(r"^\d+ upgraded, \d+ newly installed, .*$", re.MULTILINE)
FETCHED = re.compile(r"^Fetched .*$", re.MULTILINE)
# A tail that holds any one run's block: term.log grows by every run until logrotate.
TAIL_BYTES = 16 * 1024 * 1024
LAST_CHARS = 160


def stamp_epoch(stamp: str) -> float:
    """apt's ``2026-12-07  16:30:06`` (local time, as apt writes it) as epoch seconds."""
    return time.mktime(time.strptime(" ".join(stamp.split()), "%Y-%m-%d %H:%M:%S"))


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a log ("" when it is not there)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_block(text: str, start: re.Pattern[str], since: float) -> str | None:
    """The last block of a log that began at ``since`` or later (apt's stamps are whole
    seconds: one second of slack), from its header on; None when there is none."""
    found = None
    for match in start.finditer(text):
        if stamp_epoch(match.group(1)) >= since - 1:
            found = match
    if found is None:
        return None
    following = start.search(text, found.end())
    return text[found.start():following.start() if following else len(text)]


def history_plan(block: str) -> dict[str, Any]:
    """The packages of a history.log block: to unpack and set up, to remove; and whether
    dpkg has finished (End-Date)."""
    packages = removals = 0
    for line in block.splitlines():
        key, _, value = line.partition(": ")
        if key in INSTALLS:
            packages += len(PACKAGE.findall(value))
        elif key in REMOVALS:
            removals += len(PACKAGE.findall(value))
    return {"packages": packages, "removals": removals, "ended": "\nEnd-Date: " in block}


def dpkg_done(block: str) -> dict[str, Any]:
    """What dpkg has done in a term.log block: packages unpacked, set up and removed
    (each counted once), its last line that says something, and whether it has ended."""
    text = block.replace("\r", "")
    lines = [line.strip() for line in text.splitlines()]
    said = [line for line in lines if line and not NOISE.match(line)]
    last = said[-1] if said else ""
    if len(last) > LAST_CHARS:
        last = last[:LAST_CHARS - 3] + "..."
    return {"unpacked": len(set(UNPACKING.findall(text))), "set_up": len(set(SETTING_UP.findall(text))),
            "removed": len(set(REMOVING.findall(text))), "last": last, "ended": "\nLog ended: " in text}


def files_since(folder: Path, pattern: str, since: float) -> list[tuple[str, int]]:
    """(name, size) of the files of ``folder`` matching ``pattern`` whose ctime is not older
    than ``since`` (a finished download is renamed into place, which sets it)."""
    found = []
    try:
        entries = sorted(folder.glob(pattern))
    except OSError:
        return []
    for path in entries:
        try:
            st = path.stat()
        except OSError:
            continue  # renamed or removed meanwhile
        if path.is_file() and st.st_ctime >= since - 1:
            found.append((path.name, st.st_size))
    return found


def apt_progress(log_dir: str, archives: str, lists: str, since: float, now: float | None = None) -> dict[str, Any]:
    """The progress document of the apt job that started at ``since`` (epoch seconds)."""
    now = time.time() if now is None else now
    fetched = files_since(Path(archives), "*.deb", since)
    in_flight = [(name, size) for name, size in files_since(Path(archives) / "partial", "*", since) if size > 0]
    doc: dict[str, Any] = {
        "kind": "apt", "elapsed": max(0.0, now - since),
        "fetched_files": len(fetched), "fetched_bytes": sum(size for _, size in fetched) + sum(s for _, s in in_flight),
        "current": [{"path": name, "bytes": size} for name, size in in_flight],
    }
    history = last_block(read_tail(Path(log_dir) / "history.log"), HISTORY_START, since)
    term = last_block(read_tail(Path(log_dir) / "term.log"), TERM_START, since)
    if history is not None or term is not None:
        plan = history_plan(history or "")
        done = dpkg_done(term or "")
        doc.update(phase="dpkg_done" if plan["ended"] or done["ended"] else "dpkg",
                   packages=plan["packages"], removals=plan["removals"], unpacked=done["unpacked"],
                   set_up=done["set_up"], removed=done["removed"], last=done["last"])
    elif fetched or in_flight:
        doc["phase"] = "fetch"
    else:
        updating = files_since(Path(lists) / "partial", "*", since)
        if updating:
            doc.update(phase="lists", lists_bytes=sum(size for _, size in updating),
                       current=[{"path": name, "bytes": size} for name, size in updating[-1:]])
        else:
            doc["phase"] = "waiting"
    return doc


def apt_summary(result: dict[str, Any]) -> str:
    """The end of the job in apt's own words: its summary and download lines (apt-get's
    stdout, which the module returns), or its failure."""
    if result.get("failed"):
        rc = result.get("rc")
        return "apt failed" + (f" (rc {rc})" if rc is not None else "") + ": its message follows"
    stdout = str(result.get("stdout") or "")
    said = [m.group(0).rstrip(".") for pattern in (SUMMARY, FETCHED) for m in pattern.finditer(stdout)]
    if said:
        return "done: " + "; ".join(said)
    return "done: " + ("changed" if result.get("changed") else "nothing to change")
