"""Role bench follows one point's generator in rounds (tasks/progress.yml: one looping
task, no task file that includes itself), run for real on this machine through
ansible-runner with a TEST DOUBLE of the generator (playbooks/generator_double.py):
the loop prints `<host> point i/n <id>: done/total requests done` lines while the
generator runs, ends with the generator (a line ending in ` — finished`, well inside its
bound of rounds), and a generator that exits non-zero still fails the point."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import ansible_runner
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "playbooks"
TOTAL = 8


def _point(tmp_path: Path, status: int, total: int = TOTAL, hold: bool = False) -> tuple[Run, float]:
    """One point; with ``hold``, the generator stops half-way until the run has printed a
    progress line (ansible-runner hands each event over as it happens)."""
    (tmp_path / "runner").mkdir()
    hold_file = tmp_path / "seen-a-line"

    def seen(event: dict[str, Any]) -> bool:
        if event.get("event") == "runner_item_on_ok" and _is_follow(event):
            hold_file.touch()
        return True

    inventory = {"all": {"hosts": {"bench-local": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    extravars = {
        "bench_point": {"id": "sweep-in128-out16-c1", "num_prompts": total,
                        "argv": [sys.executable, str(HERE / "generator_double.py"), str(total), str(status)]
                        + ([str(hold_file)] if hold else [])},
        "bench_point_dir": str(tmp_path / "raw"), "bench_api_key": "test-key", "bench_progress_interval": 1,
        "bench_point_timeout": 60, "glm5_gpu_required": False,
    }
    began = time.monotonic()
    result = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), playbook=str(HERE / "bench_point.yml"), inventory=inventory,
        extravars=extravars,
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                 "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_ASYNC_DIR": str(tmp_path / "async"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
        quiet=True, event_handler=seen,
    )
    return Run(rc=result.rc, events=list(result.events)), time.monotonic() - began


def _is_follow(event: dict[str, Any]) -> bool:
    return str(event["event_data"].get("task", "")).startswith("Follow the generator, a line a round")


def _lines(run: Run) -> list[str]:
    """The progress lines: the labels of the follow task's rounds."""
    return [" ".join(str(e["event_data"]["res"]["_ansible_item_label"]).split()) for e in run.events
            if e.get("event") in ("runner_item_on_ok", "runner_item_on_failed") and _is_follow(e)]


def _failures(run: Run) -> list[str]:
    return [str(e["event_data"].get("res", {}).get("msg")) for e in run.task_events()
            if e["event"] == "runner_on_failed"]


def test_the_rounds_print_progress_and_end_with_the_generator(tmp_path: Path) -> None:
    run, seconds = _point(tmp_path, 0, hold=True)
    assert run.rc == 0, _failures(run)
    lines = _lines(run)
    head = "bench-local point 1/1 sweep-in128-out16-c1: "
    assert len(lines) >= 2 and all(line.startswith(head) for line in lines), lines
    assert lines[-1] == f"{head}{TOTAL}/{TOTAL} requests done — finished", lines
    done = [int(n) for line in lines for n in re.findall(rf"^(\d+)/{TOTAL} requests done", line[len(head):])]
    assert len(done) == len(lines), lines
    assert done == sorted(done) and done[0] <= TOTAL // 2, lines
    assert not any(line.endswith("— finished") for line in lines[:-1]), lines
    # The job's end ended the loop: far fewer rounds than its bound ((60 + 120) / 1 + 2 = 182,
    # at least 181 s), and its result was read and removed. The generator's hold was
    # released by the first line (not by its own limit, 120 s).
    assert len(lines) < 30 and seconds < 100, (len(lines), seconds)
    assert (tmp_path / "seen-a-line").exists()
    started = [e["event_data"]["res"] for e in run.task_events() if e["event"] == "runner_on_ok"
               and e["event_data"].get("task", "").startswith("Start the generator")]
    assert len(started) == 1 and Path(started[0]["results_file"]).parent == tmp_path / "async", started
    assert not Path(started[0]["results_file"]).exists(), "the job's result is removed once read"
    assert (tmp_path / "raw" / "sweep-in128-out16-c1.log").read_text().count("Serving Benchmark Result") == 1


def test_a_generator_that_exits_non_zero_fails_the_point(tmp_path: Path) -> None:
    run, _ = _point(tmp_path, 3, total=2)
    assert run.rc != 0
    assert _lines(run)[-1].endswith("2/2 requests done — finished"), _lines(run)
    failures = _failures(run)
    assert len(failures) == 1 and failures[0].startswith(
        "bench: the generator failed on point sweep-in128-out16-c1 (exit 3);"), failures
