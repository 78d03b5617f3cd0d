"""warm.py: a run from the warm interpreter is what a fresh `python` would have done.

Each case runs the same command both ways where that matters (warm.run and a plain
subprocess) and compares; the others check one property of the fresh interpreter the
child must be (argv, sys.path, __main__, environment, exit status, timeout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm

PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env.pop("PYTHONPATH", None)
    return env


def _warm(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    before = warm.stats["warm"]
    proc = warm.run(argv, **kwargs)  # type: ignore[arg-type]
    assert warm.stats["warm"] == before + 1, "the run was not a warm one"
    return proc


def _plain(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False, timeout=300)


def test_code_runs_as_python_c_with_its_argv_status_and_output(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys
        print(__name__, sys.argv, repr(sys.path[0]))
        print("to stderr", file=sys.stderr)
        sys.exit(int(sys.argv[1]))
    """)
    argv = [PY, "-c", code, "3", "x y"]
    env = _env()
    got, fresh = _warm(argv, env=env, cwd=tmp_path), _plain(argv, env, tmp_path)
    assert (got.returncode, got.stdout, got.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert got.returncode == 3
    assert got.stdout == "__main__ ['-c', '3', 'x y'] ''\n"


def test_an_uncaught_exception_is_status_1_with_its_traceback() -> None:
    got = _warm([PY, "-c", "raise KeyError('the key')"], env=_env())
    assert got.returncode == 1
    assert got.stderr.rstrip().endswith("KeyError: 'the key'")
    assert "Traceback" in got.stderr


def test_a_script_and_a_module_see_the_path_and_argv_python_gives_them(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    show = "import os, sys; print(sys.argv[0] == os.path.abspath(__file__), sys.argv[1:], sys.path)\n"
    (lib / "shown.py").write_text(show)
    script = tmp_path / "bin" / "show.py"
    script.parent.mkdir()
    script.write_text(show)
    env = dict(_env(), PYTHONPATH=str(lib))
    for argv in ([PY, str(script), "a"], [PY, "-m", "shown", "b"]):
        got, fresh = _warm(argv, env=env, cwd=tmp_path), _plain(argv, env, tmp_path)
        assert (got.returncode, got.stdout) == (fresh.returncode, fresh.stdout), argv
        assert got.stdout.startswith("True"), got.stdout
        assert repr(str(lib)) in got.stdout


def test_the_child_has_the_runs_environment_and_no_vllm_yet() -> None:
    env = _env(GLM5_WARM_PROBE="set", VLLM_LOGGING_LEVEL="ERROR")
    code = ("import json, os, sys; print(os.environ.get('GLM5_WARM_PROBE'), 'vllm' in sys.modules,"
            " 'torch' in sys.modules, dict(os.environ) == json.loads(sys.argv[1]))")
    got = _warm([PY, "-c", code, json.dumps(env)], env=env)
    # torch preloaded (the point of the server), vllm not (each run imports its own overlay's)
    assert got.stdout.split() == ["set", "False", "True", "True"], got.stderr[-2000:]


def test_triton_interpret_gives_a_server_of_its_own_and_the_fresh_answer() -> None:
    # triton.language's own @jit helpers are made interpreted or not when triton is
    # imported: a server preloaded without TRITON_INTERPRET would hand an interpreted
    # kernel compiled helpers ("Cannot call @triton.jit'd outside of the scope of a kernel")
    code = "import triton.language as tl; print(type(tl.sum).__name__, type(tl.cdiv).__name__)"
    for value in ("1", "0"):
        env = _env(TRITON_INTERPRET=value)
        got, fresh = _warm([PY, "-c", code], env=env), _plain([PY, "-c", code], env)
        assert got.stdout == fresh.stdout, value
    assert len({warm.identity(_env(TRITON_INTERPRET=v)) for v in ("1", "0")}) == 2


def test_a_run_past_its_timeout_is_killed_and_the_server_serves_the_next() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        _warm([PY, "-c", "import time; print('started', flush=True); time.sleep(60)"], env=_env(), timeout=2)
    assert _warm([PY, "-c", "print('next')"], env=_env()).stdout == "next\n"


def test_what_a_warm_run_cannot_be_runs_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    before = dict(warm.stats)
    assert warm.run(["/bin/echo", "plain"]).stdout == "plain\n"
    assert warm.run([PY, "-V"]).returncode == 0
    monkeypatch.setenv("GLM5_WARM_PYTHON", "0")
    assert warm.run([PY, "-c", "print(1)"]).stdout == "1\n"
    assert warm.stats["plain"] == before["plain"] + 3
    assert warm.stats["warm"] == before["warm"]


def test_past_max_servers_the_least_recently_used_one_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "MAX_SERVERS", 1)
    first, second = _env(TRITON_INTERPRET="1"), _env(TRITON_INTERPRET="0")
    assert _warm([PY, "-c", "print('first')"], env=first).stdout == "first\n"
    server = warm._servers[warm.identity(first)]
    assert _warm([PY, "-c", "print('second')"], env=second).stdout == "second\n"
    assert server.poll() is not None, "the first server still runs"
    assert list(warm._servers) == [warm.identity(second)]
