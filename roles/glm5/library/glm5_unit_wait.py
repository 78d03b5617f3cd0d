#!/usr/bin/python
"""Ansible module: one round of waiting for a systemd service to answer over HTTP, saying
how far its start-up is and failing at once when it crashes.

Role glm5's tasks/unit_wait.yml calls it in rounds of I(wait) seconds and prints its
C(line) after each (role vllm_service's /health wait, rollback's health wait, role
vllm_router's readiness wait). Within a round it looks every second at:

- the unit (systemctl show): failed, inactive, restarting (activating/auto-restart), or
  stopping after its main process exited with an error, or restarted since the wait
  began (NRestarts): the round fails at once, with the unit's last error lines from the
  journal of the run that failed, instead of waiting for the timeout;
- the unit's journal since its start (this run of the unit, _SYSTEMD_INVOCATION_ID):
  the latest line matching one of I(phases) is the phase the start-up has reached
  (vLLM: weights loaded, KV cache sized, CUDA graphs captured, application startup
  complete), said with the time since the unit started;
- I(url): ready when it answers 200 (and, with I(json_equals), a JSON body with those
  values).

It changes nothing. What one round learnt (when the wait began, the restart count then,
the journal cursor and the phase) is returned in C(state) and passed to the next.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_progress import human_seconds

DOCUMENTATION = r"""
module: glm5_unit_wait
short_description: One round of a readiness wait on a systemd service (phase, crash detection)
description:
  - Waits at most I(wait) seconds for I(url) to answer 200, looking every second at the
    unit's state and journal. Fails at once when the unit is failed, inactive,
    restarting or restarted, naming the unit's last error lines; fails when I(timeout)
    seconds have passed since the wait began.
options:
  unit: {description: The systemd unit (".service" is added when there is no suffix)., type: str, required: true}
  url: {description: The URL that answers 200 when the service is ready., type: str, required: true}
  json_equals: {description: Values the JSON answer must have as well (key -> value)., type: dict, default: {}}
  timeout: {description: Seconds the whole wait may take (from its first round)., type: float, required: true}
  wait: {description: Seconds this round waits at most., type: float, default: 30}
  poll: {description: Seconds between looks., type: float, default: 1}
  phases:
    description:
      - Start-up phases, in order, each a mapping C(pattern) (a regular expression searched
        in each journal line) and C(say) (what the phase is called; C(\\1) etc. are the
        pattern's groups).
    type: list
    elements: dict
    default: []
  error_lines: {description: How many of the unit's last error lines a failure names., type: int, default: 12}
  state: {description: The C(state) the previous round returned ({} for the first)., type: dict, default: {}}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_unit_wait:
    unit: vllm-glm-5
    url: http://127.0.0.1:8000/health
    timeout: 3600
    phases:
      - {pattern: 'Model loading took (\S+) GiB memory and ([0-9.]+) seconds', say: 'weights loaded (\1 GiB)'}
    state: "{{ previous.state | default({}) }}"
  register: previous
"""

RETURN = r"""
ready: {description: The URL answered as required., type: bool, returned: always}
line: {description: What the round saw, in one line., type: str, returned: always}
phase: {description: The start-up phase reached ("" before the first)., type: str, returned: always}
elapsed: {description: Seconds since the unit started (else since the wait began)., type: float, returned: always}
state: {description: To pass to the next round., type: dict, returned: always}
"""

ERROR_RE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|Error\b|Exception\b|Traceback|\berror:", re.IGNORECASE)
SHOW = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "InvocationID", "ExecMainCode",
        "ExecMainStatus", "ExecMainStartTimestampMonotonic", "RestartUSec")


def unit_show(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, *(f"--property={p}" for p in SHOW)],
                         capture_output=True, text=True, check=False).stdout
    return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)


def failure(show: dict[str, str], baseline: int) -> str:
    """Why the unit is not on its way to serving, or ""."""
    active, sub, result = show.get("ActiveState", ""), show.get("SubState", ""), show.get("Result", "")
    restarts = int(show.get("NRestarts") or 0)
    if show.get("LoadState") not in (None, "", "loaded"):
        return f"is {show.get('LoadState')} (no such unit?)"
    if active == "failed":
        return f"failed ({result})"
    if sub == "auto-restart":
        return f"is restarting after a crash ({result}): activating (auto-restart)"
    if active == "deactivating" and result not in ("", "success"):
        return f"is stopping after its main process ended ({result})"
    if active == "inactive":
        return "is inactive (dead): it stopped, or was never started"
    if restarts > baseline:
        return f"was restarted {restarts - baseline} time(s) by systemd since the wait began (it crashed)"
    return ""


def exit_text(show: dict[str, str]) -> str:
    """How the main process ended (ExecMainCode is a CLD_* code: 1 exited, 2 killed, 3 dumped)."""
    code, status = show.get("ExecMainCode", ""), show.get("ExecMainStatus", "?")
    return {"1": f"exited with status {status}", "2": f"was killed by signal {status}",
            "3": f"dumped core (signal {status})"}.get(code, "has not ended")


def journal(args: list[str]) -> list[str]:
    out = subprocess.run(["journalctl", "--no-pager", "-o", "cat", *args], capture_output=True, text=True,
                         check=False, errors="replace").stdout
    return out.splitlines()


def new_lines(invocation: str, cursor: str) -> tuple[list[str], str]:
    """The invocation's journal lines after ``cursor``, and the cursor of the last one."""
    if not invocation:
        return [], cursor
    args = [f"_SYSTEMD_INVOCATION_ID={invocation}", "--show-cursor"]
    if cursor:
        args.append(f"--after-cursor={cursor}")
    lines = journal(args)
    if lines and lines[-1].startswith("-- cursor: "):
        cursor = lines.pop()[len("-- cursor: "):]
    return lines, cursor


def error_lines(unit: str, invocation: str, since: float, count: int) -> list[str]:
    """The last error lines of the run that failed (its last lines when none looks like one)."""
    subprocess.run(["journalctl", "--sync"], capture_output=True, check=False)
    time.sleep(0.5)  # what the process wrote last may still be on its way into the journal
    lines = journal([f"_SYSTEMD_INVOCATION_ID={invocation}"]) if invocation else []
    if not lines:
        lines = journal(["-u", unit, f"--since=@{int(since)}"])
    errors = [line for line in lines if ERROR_RE.search(line)]
    return (errors or lines)[-count:]


def match_phase(lines: list[str], phases: list[dict[str, Any]], current: str) -> str:
    for line in lines:
        for ph in phases:
            found = re.search(str(ph.get("pattern", "")), line)
            if found:
                current = found.expand(str(ph.get("say", ""))) if ph.get("say") else line.strip()
    return current


def probe(url: str, json_equals: dict[str, Any]) -> tuple[bool, str]:
    """(ready, what the URL answered)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as answer:
            status, body = answer.status, answer.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"no answer ({reason})"
    if status != 200:
        return False, f"HTTP {status}"
    if not json_equals:
        return True, "HTTP 200"
    try:
        doc = json.loads(body)
    except ValueError:
        return False, "HTTP 200 without JSON"
    differ = [f"{k} {doc.get(k)!r}, want {v!r}" for k, v in json_equals.items()
              if not isinstance(doc, dict) or str(doc.get(k)) != str(v)]
    return (not differ), "HTTP 200" + (f" ({'; '.join(differ)})" if differ else "")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "json_equals": {"type": "dict", "default": {}},
            "timeout": {"type": "float", "required": True},
            "wait": {"type": "float", "default": 30},
            "poll": {"type": "float", "default": 1},
            "phases": {"type": "list", "elements": "dict", "default": []},
            "error_lines": {"type": "int", "default": 12},
            "state": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    unit = p["unit"] if "." in p["unit"] else p["unit"] + ".service"
    state = dict(p["state"] or {})
    now = time.time()
    state.setdefault("began", now)
    show = unit_show(unit)
    state.setdefault("restarts", int(show.get("NRestarts") or 0))
    state.setdefault("cursor", "")
    state.setdefault("phase", "")
    round_end = time.monotonic() + max(0.0, p["wait"])
    while True:
        show = unit_show(unit)
        invocation = show.get("InvocationID", "")
        if invocation and invocation != state.get("invocation"):
            state.update(invocation=invocation, cursor="", phase="")
        lines, state["cursor"] = new_lines(invocation, state["cursor"])
        phase = match_phase(lines, p["phases"], state["phase"])
        started_us = int(show.get("ExecMainStartTimestampMonotonic") or 0)
        elapsed = time.monotonic() - started_us / 1e6 if started_us else time.time() - state["began"]
        if phase != state["phase"]:
            state.update(phase=phase, phase_at=round(elapsed, 1))
        why = failure(show, int(state["restarts"]))
        if why:
            during = f", while {state['phase']}" if state["phase"] else ""
            last = error_lines(unit, invocation, state["began"], p["error_lines"])
            module.fail_json(
                msg=(f"{unit} {why}, {human_seconds(elapsed)} after it started{during}; its main process"
                     f" {exit_text(show)}. Its last error lines:\n"
                     + "\n".join(last) + f"\n(the whole log: journalctl -u {unit})"),
                ready=False, phase=state["phase"], elapsed=elapsed, state=state, error_lines=last)
        ready, answer = probe(p["url"], p["json_equals"])
        waited = time.time() - state["began"]
        where = f"{show.get('ActiveState', '?')} ({show.get('SubState', '?')}) for {human_seconds(elapsed)}"
        said = f"; {state['phase']} (at {human_seconds(float(state.get('phase_at', 0)))})" if state["phase"] else ""
        line = f"{unit} {where}{said}; {p['url']}: {answer}"
        if ready:
            module.exit_json(changed=False, ready=True, line=f"{unit} ready after {human_seconds(elapsed)}{said}",
                             phase=state["phase"], elapsed=elapsed, state=state)
        if waited >= p["timeout"]:
            module.fail_json(msg=f"{unit} not ready after the wait of {human_seconds(waited)}: {line}"
                                 f" (journalctl -u {unit})", ready=False, phase=state["phase"], elapsed=elapsed,
                             state=state)
        if time.monotonic() >= round_end:
            module.exit_json(changed=False, ready=False, line=line, phase=state["phase"], elapsed=elapsed,
                             state=state)
        time.sleep(max(0.1, p["poll"]))


if __name__ == "__main__":
    main()
