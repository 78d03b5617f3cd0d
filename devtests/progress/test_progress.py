"""The progress of the long waits: role glm5's module_utils/glm5_progress.py (the words),
module glm5_job_progress (one round of following a background job), module
glm5_unit_wait's pure parts (crash detection from systemd's properties, the start-up
phase from the journal), the phases against vLLM 0.20.2's own log texts and the
stand-in's start-up lines."""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from adhoc import call_module
from load_file import load_file, load_role_module

ROOT = Path(__file__).resolve().parents[2]
job_progress = load_role_module("roles/glm5/library/glm5_job_progress.py")
unit_wait = load_role_module("roles/glm5/library/glm5_unit_wait.py")
words = load_file(ROOT / "roles" / "glm5" / "module_utils" / "glm5_progress.py", "glm5_progress_words")
standin = load_file(ROOT / "src" / "glm5_tools" / "probe" / "standin.py", "glm5_standin_progress")
PHASES: list[dict[str, str]] = yaml.safe_load(
    (ROOT / "roles" / "glm5" / "defaults" / "main" / "versions.yml").read_text())["glm5_vllm_start_phases"]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: the whole roles/ tree in well under a second
VLLM = sorted((ROOT / ".venv-ml" / "lib").glob("python3*/site-packages/vllm"))


def test_describe_a_fetch_in_flight_resumed() -> None:
    doc = {"what": "unsloth/GLM-5-GGUF", "files_done": 3, "files_total": 10, "bytes_done": 120_500_000_000,
           "bytes_total": 400_000_000_000, "rate": 95_100_000.0,
           "current": [{"path": "q/a-00004.gguf", "bytes": 12_300_000_000, "size": 45_000_000_000},
                       {"path": "q/a-00005.gguf", "bytes": 1, "size": 2}],
           "resumed_bytes": 50_200_000_000, "resumed_files": 1, "resumed_partial": 2}
    assert words.describe(doc) == (
        "unsloth/GLM-5-GGUF: 3 of 10 files, 120.5 GB of 400.0 GB (30 %), 95.1 MB/s, about 48 min 59 s left;"
        " now q/a-00004.gguf (12.3 GB of 45.0 GB) and 1 more"
        " (resumed: 50.2 GB were already here, 1 complete files, 2 partial)")


def test_describe_the_other_states() -> None:
    assert words.describe({"what": "x", "note": "reading the repository's file list"}) == \
        "x: reading the repository's file list"
    assert words.describe({"what": "x", "done": True, "nothing_to_do": True, "files_total": 1,
                           "bytes_total": 1000}) == "x: all 1 file (1.0 kB) in place already"
    assert words.describe({"what": "sha256", "done": True, "files_done": 2, "files_total": 2, "bytes_done": 5,
                           "bytes_total": 5, "elapsed": 3725, "cached": 1}) == (
        "sha256: 2 of 2 files, 5 B done in 1 h 02 min (1 more file unchanged since the last verified hash:"
        " not hashed again)")
    assert words.describe({"what": "x", "bytes_total": 10, "bytes_done": 5, "files_total": 1, "rate": 0,
                           "note": "waiting"}) == "x: 0 of 1 files, 5 B of 10 B (50 %), 0 B/s; waiting"
    assert [words.human_seconds(s) for s in (0, 59.4, 60, 3599, 3600)] == \
        ["0 s", "59 s", "1 min 00 s", "59 min 59 s", "1 h 00 min"]


def _results_file(tmp_path: Path, started: bool = True) -> Path:
    path = tmp_path / "j123.456"
    path.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j123.456"} if started else {}))
    return path


def test_job_progress_waits_a_round_and_reads_the_document(tmp_path: Path) -> None:
    results = _results_file(tmp_path)
    progress = tmp_path / "p.json"
    words.write_atomic(str(progress), {"what": "w", "files_total": 2, "bytes_total": 10, "bytes_done": 4,
                                       "updated": time.time()})
    began = time.monotonic()
    got = call_module(job_progress, {"results_file": str(results), "wait": 1.0, "progress": str(progress)})
    assert 0.9 <= time.monotonic() - began < 5
    assert got["finished"] is False and got["line"].startswith("w: 0 of 2 files, 4 B of 10 B (40 %)")
    assert results.exists()


def test_job_progress_returns_when_the_job_ends_keeping_only_what_is_asked(tmp_path: Path) -> None:
    results = _results_file(tmp_path)
    result = {"rc": 0, "stdout": "{}", "changed": True,
              "invocation": {"module_args": {"argv": ["x"], "stdin": "secret-token-value"}}}
    threading.Timer(0.5, lambda: results.write_text(json.dumps(result))).start()
    began = time.monotonic()
    got = call_module(job_progress, {"results_file": str(results), "wait": 20.0, "keep": ["rc", "stdout"]})
    assert time.monotonic() - began < 5
    assert got["finished"] is True and got["result"] == {"rc": 0, "stdout": "{}"}
    assert "secret-token-value" not in json.dumps(got)
    assert not results.exists(), "the job's result (its arguments included) is removed once read"


def test_job_progress_does_not_show_a_previous_runs_document(tmp_path: Path) -> None:
    progress = tmp_path / "p.json"
    words.write_atomic(str(progress), {"what": "old", "done": True, "updated": time.time() - 600})
    results = _results_file(tmp_path)
    got = call_module(job_progress, {"results_file": str(results), "wait": 0.0, "progress": str(progress)})
    assert got["line"] == "started (no progress reported yet)"


def test_job_progress_log_tail_and_a_lost_job(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("".join(f"[{i}/73] nvcc\n" for i in range(1, 11)))
    results = _results_file(tmp_path)
    got = call_module(job_progress, {"results_file": str(results), "wait": 0.0, "log": str(log), "log_lines": 2})
    assert got["lines"] == ["[9/73] nvcc", "[10/73] nvcc"] and got["line"] == "[9/73] nvcc | [10/73] nvcc"
    results.unlink()
    lost = call_module(job_progress, {"results_file": str(results), "wait": 0.0})
    assert lost["failed"] and "is gone" in lost["msg"]


@pytest.mark.parametrize(("show", "why"), [
    ({"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, ""),
    ({"ActiveState": "activating", "SubState": "start-pre", "NRestarts": "0"}, ""),
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code", "NRestarts": "0"},
     "is restarting after a crash (exit-code): activating (auto-restart)"),
    ({"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit"}, "failed (start-limit-hit)"),
    ({"ActiveState": "deactivating", "SubState": "stop-sigterm", "Result": "exit-code"},
     "is stopping after its main process ended (exit-code)"),
    ({"ActiveState": "deactivating", "SubState": "stop-sigterm", "Result": "success"}, ""),
    ({"ActiveState": "inactive", "SubState": "dead", "Result": "success"},
     "is inactive (dead): it stopped, or was never started"),
    ({"ActiveState": "active", "SubState": "running", "NRestarts": "2"},
     "was restarted 1 time(s) by systemd since the wait began (it crashed)"),
    ({"LoadState": "not-found", "ActiveState": "inactive"}, "is not-found (no such unit?)"),
])
def test_crash_detection_from_systemds_properties(show: dict[str, str], why: str) -> None:
    assert unit_wait.failure({"LoadState": "loaded", **show}, 1) == why


def _args(**more: Any) -> argparse.Namespace:
    return argparse.Namespace(model="/srv/models/glm-5/gguf/q/GLM-5-00001-of-00010.gguf", host="127.0.0.1",
                              port=8000, max_model_len=202752, **more)


def test_the_stand_ins_start_up_goes_through_every_phase_in_order() -> None:
    lines = [line for line, _ in standin.startup_lines(_args())]
    seen = []
    for line in lines:
        assert re.match(r"^\((EngineCore_DP0|APIServer) pid=\d+\) (INFO|ERROR)", line), line
        phase = unit_wait.match_phase([line], PHASES, "")
        if phase:
            seen.append(phase)
    assert seen == [
        "loading the weights", "weights loaded (47.31 GiB per GPU in 312.504121 s)",
        "sizing the KV cache (31.2 GiB per GPU free for it)", "KV cache sized (1,020,928 tokens)",
        "capturing CUDA graphs", "CUDA graphs captured (in 14 s)", "engine ready (its start took 96.41 s)",
        "starting the API server on http://127.0.0.1:8000", "application startup complete"]
    assert unit_wait.match_phase(lines, PHASES, "") == "application startup complete"


def test_the_stand_ins_kv_cache_failure_ends_in_vllms_error_lines() -> None:
    lines = [line for line, _ in standin.startup_lines(_args(), fail="kv_cache")]
    errors = [line for line in lines if unit_wait.ERROR_RE.search(line)]
    assert errors == lines[-4:]
    assert "ValueError: To serve at least one request with the models's max seq len (202752)" in errors[2]
    assert unit_wait.match_phase(lines, PHASES, "") == "sizing the KV cache (31.2 GiB per GPU free for it)"


@pytest.mark.skipif(not VLLM, reason="needs the ml venv's vLLM (.venv-ml, scripts/ml-venv)")
def test_every_phase_is_a_text_vllm_logs() -> None:
    """Each phase pattern's literal text is in vLLM 0.20.2's (or uvicorn's) source, as a
    log format string: a new pin whose texts changed fails here."""
    site = VLLM[0].parent
    sources = "".join(p.read_text(errors="replace") for base in (site / "vllm", site / "uvicorn")
                      for p in base.rglob("*.py"))
    for phase in PHASES:
        literal = re.split(r"\(\\S\+\)|\(\[0-9.\]\+\)|\(\[0-9,\]\+\)|\(\S+\)", phase["pattern"])[0]
        literal = literal.replace("\\(", "(").replace("\\)", ")").strip()
        assert literal and literal in sources, f"{phase['pattern']!r}: {literal!r} not in vLLM's source"


def _includes(node: Any, role: str) -> list[str]:
    """Every task file a task list includes (blocks included), as role/tasks/name:
    include_tasks targets (in ``role``) and include_role's tasks_from."""
    found: list[str] = []
    for task in node if isinstance(node, list) else []:
        if not isinstance(task, dict):
            continue
        for key in ("ansible.builtin.include_tasks", "include_tasks"):
            target = task.get(key)
            if target is not None:
                name = Path(str(target.get("file", "") if isinstance(target, dict) else target)).name
                found.append(f"{role}/tasks/{name}")
        for key in ("ansible.builtin.include_role", "include_role"):
            target = task.get(key)
            if isinstance(target, dict):
                name = str(target.get("tasks_from", "main"))
                found.append(f"{target.get('name')}/tasks/{name if name.endswith('.yml') else name + '.yml'}")
        for part in ("block", "rescue", "always"):
            found += _includes(task.get(part), role)
    return found


def test_no_task_file_includes_itself_once_a_round() -> None:
    """Each include nests Ansible's iterator one level deeper: a task file that includes
    itself once a round stops the run with a RecursionError after some 250 rounds
    (measured with ansible-core 2.19: two hours of 30 s rounds). The waits loop over their
    rounds in one task instead (role glm5's follow.yml and unit_wait.yml, role bench's
    progress.yml), with no exception: no task file of any role includes itself."""
    files = sorted(ROOT.glob("roles/*/tasks/*.yml"))
    assert ROOT / "roles" / "bench" / "tasks" / "progress.yml" in files
    assert "glm5/tasks/follow.yml" in _includes(yaml.safe_load((ROOT / "roles/model/tasks/verify.yml").read_text()),
                                                "model"), "include_role's tasks_from is not read"
    selfish = [str(f.relative_to(ROOT)) for f in files
               if str(f.relative_to(ROOT / "roles")) in _includes(yaml.load(f.read_text(), LOADER), f.parts[-3])]
    assert selfish == []
    for path in ("glm5/tasks/follow.yml", "glm5/tasks/unit_wait.yml", "bench/tasks/progress.yml"):
        tasks = yaml.safe_load((ROOT / "roles" / path).read_text())
        loops = [t for t in tasks if "loop" in t]
        assert len(loops) == 1 and "break_when" in loops[0]["loop_control"] and "label" in loops[0]["loop_control"]
        assert _includes(tasks, path.split("/")[0]) == [], path
