"""Role vllm_service skips vLLM's argument parse when its inputs are those of the last
parse that passed (the no-op re-run in seconds, docs/noop-shortcut.md), and parses again when
any input changes: the arguments, the venv's lock marker or patch-set manifest. Real
vLLM 0.20.2 parser (.venv-ml), ansible-runner on this machine (connection local), not in
check mode: the record goes to a temporary directory (vllm_service_config_dir)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
ML_PYTHON = ROOT / ".venv-ml" / "bin" / "python"
PARSE = "Parse the ExecStart arguments with the installed vLLM's parser"
RECORD = "Record the parse that passed (an identical one is skipped next time)"

pytestmark = pytest.mark.skipif(not ML_PYTHON.exists(), reason="needs .venv-ml (scripts/ml-venv) with vLLM 0.20.2")


def _status(run: Run, task: str) -> str:
    found = [e["event"] for e in run.task_events() if e["event_data"].get("task") == task]
    assert found, f"task {task!r} did not run"
    return found[-1]


def _changed(run: Run) -> list[str]:
    return [e["event_data"]["task"] for e in run.task_events() if e["event_data"].get("res", {}).get("changed")]


def test_identical_parse_skipped_changed_inputs_parsed(
    tmp_path: Path, model_files: dict[str, str], run_local: Callable[..., Run]
) -> None:
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.12" / "site-packages" / "vllm").mkdir(parents=True)
    (venv / ".glm5-lock.sha256").write_text("a" * 64 + "\n")
    manifest = venv / "lib" / "python3.12" / "site-packages" / "vllm" / ".glm5-patchset.json"
    manifest.write_text('{"patches": ["0001"]}\n')
    config = tmp_path / "etc-glm5"
    base = {
        **model_files,
        "vllm_service_validate_args": True,
        # The unpatched .venv-ml knows TRITON_MLA, not the patch set's TRITON_MLA_SPARSE.
        "vllm_service_attention": "dense",
        "vllm_service_argcheck_python": str(ML_PYTHON),
        "glm5_venv_path": str(venv),
        "vllm_service_config_dir": str(config),
    }

    first = run_local("service_argcheck.yml", base, check=False)
    assert first.rc == 0
    assert _status(first, PARSE) == "runner_on_ok"
    assert RECORD in _changed(first)
    record = (config / "vllm-glm-5.argcheck.sha256").read_text()

    # Nothing changed: no parse, no change.
    again = run_local("service_argcheck.yml", base, check=False)
    assert again.rc == 0
    assert _status(again, PARSE) == "runner_on_skipped"
    assert _changed(again) == []
    assert (config / "vllm-glm-5.argcheck.sha256").read_text() == record

    # Each input changed parses again: the arguments, the venv's lock, the patch set.
    for change in ("args", "lock", "patches"):
        extra = dict(base)
        if change == "args":
            extra["vllm_service_gpu_memory_utilization"] = 0.9
        elif change == "lock":
            (venv / ".glm5-lock.sha256").write_text("b" * 64 + "\n")
        else:
            manifest.write_text('{"patches": ["0001", "0002"]}\n')
        parsed = run_local("service_argcheck.yml", extra, check=False)
        assert parsed.rc == 0, change
        assert _status(parsed, PARSE) == "runner_on_ok", change
        assert RECORD in _changed(parsed), change

    # A bad argument after a recorded good parse is still refused by vLLM's parser.
    bad = run_local("service_argcheck.yml", {**base, "vllm_service_extra_args": ["--no-such-flag"]}, check=False)
    assert bad.rc != 0
    assert bad.first_failure()["event_data"]["task"] == PARSE
