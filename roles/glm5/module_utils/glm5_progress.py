"""Progress of the long tasks, as one sentence: the one formatter of the progress files.

The background work of a deploy (role model's fetch, hf_fetch.py, and its sha256
verification, module glm5_model_verify) writes a progress file of numbers, rewritten
every few seconds; module glm5_job_progress (role glm5's follow.yml) reads it each
round and prints ``describe(doc)``. Keys of a progress document (all optional but
``bytes_total``):

  what            what is measured ("sha256", a repository name)
  done            the work has ended
  files_done, files_total, bytes_done, bytes_total
  rate            bytes a second, measured by the writer over its recent past
  current         [{path, bytes, size}] of the files in flight
  note            a state to say instead of the files in flight ("waiting for ...")
  resumed_bytes, resumed_files, resumed_partial   what was already there at the start
  cached          files found unchanged since their last verified hash (not hashed)
  elapsed         seconds since the work started
  updated         when the document was written (epoch seconds; an older one than the
                  job is a previous run's and is not shown)
  nothing_to_do   every file was in place already

A document with ``kind: apt`` is an apt install in flight, read from apt's and dpkg's own
logs by module_utils/glm5_apt_progress.py (its keys are listed there: phase, packages,
unpacked, set_up, fetched_bytes, ...); ``describe`` puts it in words with ``describe_apt``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def human_bytes(n: float) -> str:
    """1.2 GB, 350.0 MB, 12 B (decimal units, as disks and links are sold)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_seconds(s: float) -> str:
    """45 s, 3 min 05 s, 1 h 07 min."""
    whole = int(s + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def count(n: int, noun: str) -> str:
    """1 file, 2 files."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe_apt(doc: dict[str, Any]) -> str:
    """An apt install in flight as one sentence (module_utils/glm5_apt_progress.py's
    document): what apt fetches, or what dpkg has unpacked and set up of the total."""
    phase = doc.get("phase")
    fetched, files = int(doc.get("fetched_bytes") or 0), int(doc.get("fetched_files") or 0)
    current = [c for c in doc.get("current") or [] if isinstance(c, dict)]
    took = human_seconds(float(doc.get("elapsed") or 0))
    now = ""
    if current:
        now = f"; now {current[-1].get('path')} ({human_bytes(int(current[-1].get('bytes') or 0))} so far)"
        if len(current) > 1:
            now += f" and {len(current) - 1} more"
    if phase in ("dpkg", "dpkg_done"):
        total = int(doc.get("packages") or 0)
        text = (f"dpkg has unpacked {int(doc.get('unpacked') or 0)} of {total} packages and set up"
                f" {int(doc.get('set_up') or 0)} of {total}")
        if doc.get("removals"):
            text += f", removed {int(doc.get('removed') or 0)} of {int(doc['removals'])}"
        if fetched:
            text += f" ({human_bytes(fetched)} fetched)"
        if phase == "dpkg_done":
            return text + "; dpkg has finished, apt is ending"
        return text + (f"; last: {doc['last']}" if doc.get("last") else "")
    if phase == "fetch":
        return f"fetching the packages: {human_bytes(fetched)} so far in {took}, {count(files, 'file')} complete{now}"
    if phase == "lists":
        return f"updating the package lists: {human_bytes(int(doc.get('lists_bytes') or 0))} so far{now}"
    return f"resolving the packages: nothing fetched or unpacked yet after {took}"


def describe(doc: dict[str, Any]) -> str:
    """The progress document as one sentence."""
    if doc.get("kind") == "apt":
        return describe_apt(doc)
    what = str(doc.get("what") or "progress")
    total = int(doc.get("bytes_total") or 0)
    done_bytes = int(doc.get("bytes_done") or 0)
    files_total = int(doc.get("files_total") or 0)
    files_done = int(doc.get("files_done") or 0)
    rate = float(doc.get("rate") or 0.0)
    if not total and not files_total and not doc.get("done"):
        return f"{what}: {doc.get('note') or 'starting'}"
    if doc.get("done") and doc.get("nothing_to_do"):
        text = f"{what}: all {count(files_total, 'file')} ({human_bytes(total)}) in place already"
    elif doc.get("done"):
        text = f"{what}: {files_done} of {files_total} files, {human_bytes(done_bytes)} done"
        if doc.get("elapsed"):
            text += f" in {human_seconds(float(doc['elapsed']))}"
    else:
        pct = 100.0 * done_bytes / total if total else 100.0
        text = (f"{what}: {files_done} of {files_total} files, {human_bytes(done_bytes)} of {human_bytes(total)}"
                f" ({pct:.0f} %), {human_bytes(max(rate, 0.0))}/s")
        if rate > 0 and total > done_bytes:
            text += f", about {human_seconds((total - done_bytes) / rate)} left"
        current = [c for c in doc.get("current") or [] if isinstance(c, dict)]
        if doc.get("note"):
            text += f"; {doc['note']}"
        elif current:
            first = current[0]
            text += (f"; now {first.get('path')} ({human_bytes(int(first.get('bytes') or 0))} of"
                     f" {human_bytes(int(first.get('size') or 0))})")
            if len(current) > 1:
                text += f" and {len(current) - 1} more"
    if doc.get("resumed_bytes"):
        complete, partial = int(doc.get("resumed_files") or 0), int(doc.get("resumed_partial") or 0)
        text += (f" (resumed: {human_bytes(int(doc['resumed_bytes']))} were already here, {complete} complete"
                 f" files, {partial} partial)")
    if doc.get("cached"):
        text += f" ({count(int(doc['cached']), 'more file')} unchanged since the last verified hash: not hashed again)"
    return text


def write_atomic(path: str, doc: dict[str, Any]) -> None:
    """Replace the file at ``path`` with ``doc`` as JSON (a reader never sees half of it)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc) + "\n")
    Path(tmp).replace(path)
