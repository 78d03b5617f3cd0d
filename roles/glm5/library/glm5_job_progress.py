#!/usr/bin/python
"""Ansible module: one round of following a background (async) task: wait up to I(wait)
seconds for it to end, and say how far it is.

Long tasks (the model fetch, the sha256 verification, the flash-attn build) run with
``async``/``poll: 0``; role glm5's tasks/follow.yml calls this module in rounds and
prints its C(line) after each, so that the run shows progress while the work goes on.
The job's progress is read from a JSON file of numbers it writes (the document of
role glm5's module_utils/glm5_progress.py, put in words by its describe()), from the
last lines of its log, or, for an apt install (I(apt)), from apt's and dpkg's own
records (module_utils/glm5_apt_progress.py: packages unpacked and set up of the total,
bytes fetched). The job has ended when Ansible's async wrapper has replaced the
C(results_file) the async task returned (a documented return value) with the module's
result; this module then returns the keys of that result named in I(keep) (never the
module's invocation, which may hold arguments not to be shown) and removes the file.
It changes nothing else.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_apt_progress import apt_progress, apt_summary
from ansible.module_utils.glm5_progress import describe

DOCUMENTATION = r"""
module: glm5_job_progress
short_description: One round of following an async task (wait, then report its progress)
description:
  - Waits until the async job whose C(results_file) is I(results_file) has ended, at most
    I(wait) seconds, then returns C(finished), a progress C(line) (from I(progress), the
    last I(log_lines) lines of I(log), or apt's logs and archives with I(apt)) and, once
    finished, C(result) (the keys I(keep) of the job's result). Removes the results file
    once read.
options:
  results_file: {description: The results_file an async task with poll 0 returned., type: path, required: true}
  wait: {description: Seconds to wait at most in this round., type: float, default: 30}
  progress: {description: Progress document the job writes (module_utils/glm5_progress.py)., type: path, default: ""}
  log: {description: Log whose last lines are the progress (when there is no progress file)., type: path, default: ""}
  log_lines: {description: How many of the log's last lines., type: int, default: 3}
  apt:
    description:
      - The job is an apt install; its progress is read from apt's logs (I(apt_log_dir)), the
        archives it fetches into (I(apt_archives)) and the lists it updates (I(apt_lists)), and
        its end is told in apt's own summary lines.
    type: bool
    default: false
  apt_log_dir: {description: apt's log directory (Dir::Log)., type: path, default: /var/log/apt}
  apt_archives: {description: apt's archives (Dir::Cache::archives)., type: path, default: /var/cache/apt/archives}
  apt_lists: {description: apt's lists (Dir::State::lists)., type: path, default: /var/lib/apt/lists}
  keep:
    description: Keys of the job's result to return.
    type: list
    elements: str
    default: [rc, stdout, stderr, msg, failed, changed]
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_job_progress:
    results_file: "{{ job.results_file }}"
    progress: /var/lib/glm5/model/fetch-gguf.json
    wait: 30
  register: round
"""

RETURN = r"""
finished: {description: Whether the job has ended., type: bool, returned: always}
line: {description: Its progress (or the end's result) in one line., type: str, returned: always}
lines: {description: The log's last lines (with I(log))., type: list, returned: always}
result: {description: The kept keys of the job's result (once finished)., type: dict, returned: always}
"""

POLL_S = 0.5


def job_result(path: Path) -> dict[str, Any] | None:
    """The job's result once it has ended, else None (Ansible's async wrapper writes
    {"started": 1, "finished": 0, ...} first and the module's result at the end)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None  # being written
    if not isinstance(data, dict) or "started" in data:
        return None
    return data


def progress_line(progress: str, log: str, log_lines: int, since: float,
                  apt: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The progress in words (a document written before ``since``, the job's start, is a
    previous run's: not shown), and the log's last lines. ``apt``: the directories of an
    apt job's logs, archives and lists."""
    if apt:
        return describe(apt_progress(apt["log_dir"], apt["archives"], apt["lists"], since)), []
    if progress:
        try:
            doc = json.loads(Path(progress).read_text())
        except (OSError, ValueError):
            return "", []
        if not isinstance(doc, dict) or float(doc.get("updated") or 0) < since - 1:
            return "", []
        return describe(doc), []
    if log:
        try:
            with Path(log).open(errors="replace") as fh:
                tail = [line.rstrip("\n") for line in deque(fh, maxlen=max(1, log_lines))]
            return " | ".join(tail), tail
        except OSError:
            return "", []
    return "", []


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "results_file": {"type": "path", "required": True},
            "wait": {"type": "float", "default": 30},
            "progress": {"type": "path", "default": ""},
            "log": {"type": "path", "default": ""},
            "log_lines": {"type": "int", "default": 3},
            "apt": {"type": "bool", "default": False},
            "apt_log_dir": {"type": "path", "default": "/var/log/apt"},
            "apt_archives": {"type": "path", "default": "/var/cache/apt/archives"},
            "apt_lists": {"type": "path", "default": "/var/lib/apt/lists"},
            "keep": {"type": "list", "elements": "str", "default": ["rc", "stdout", "stderr", "msg", "failed",
                                                                      "changed"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    path = Path(p["results_file"])
    deadline = time.monotonic() + max(0.0, p["wait"])
    data = job_result(path)
    while data is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
        data = job_result(path)
    try:
        since = path.stat().st_mtime if data is None else 0.0  # the job's start: its "started" record
    except OSError:
        since = 0.0
    apt = {"log_dir": p["apt_log_dir"], "archives": p["apt_archives"], "lists": p["apt_lists"]} if p["apt"] else None
    lines: list[str] = []
    if data is not None and apt:
        # The job's start is no longer known (its record was replaced by the result): the
        # end in apt's own words instead of the logs.
        line = apt_summary(data)
    else:
        line, lines = progress_line(p["progress"], p["log"], p["log_lines"], since, apt)
    if data is None:
        if not path.exists():  # a job that has ended leaves its result in place until read
            module.fail_json(msg=f"the background job's results file {path} is gone (another run took it, or a"
                                 " reboot): its result is unknown; run again", finished=True)
        quiet = f"running, nothing in {p['log']} yet" if p["log"] else "started (no progress reported yet)"
        module.exit_json(changed=False, finished=False, line=line or quiet, lines=lines, result={})
        return
    kept = {k: data[k] for k in p["keep"] if k in data}
    path.unlink(missing_ok=True)
    module.exit_json(changed=False, finished=True, line=line or "done", lines=lines, result=kept)


if __name__ == "__main__":
    main()
