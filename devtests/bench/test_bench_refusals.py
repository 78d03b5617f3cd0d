"""playbooks/bench.yml refuses bad variables (naming the variable, the value and the
accepted form) and a service that is not ready, before any request is sent. Runs the
real playbook against the controller itself (no service there: nothing listens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _play(tmp_path: Path, extra: dict) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"gpu_servers": {"hosts": {"bench-local": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    extra = {"bench_results_root": str(tmp_path / "results"), "bench_unit": "glm5-bench-no-such-unit",
             "bench_api_url": "http://127.0.0.1:9", **extra}
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         str(ROOT / "playbooks" / "bench.yml"), "-e", json.dumps(extra)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"bench_run_profiles": ["sweep", "nope"]},
         'bench_run_profiles is ["sweep", "nope"]; expected a non-empty list of names defined in bench_profiles'),
        ({"bench_profiles": {"p": {"kind": "context", "input_len": [512, 0], "output_len": 16}},
          "bench_run_profiles": ["p"]},
         'bench_profiles.p.input_len is [512, 0]; expected a whole number >= 1, "max"'),
        ({"bench_thresholds": [{"figure": "speed", "min": 1}]},
         'bench_thresholds entry {"figure": "speed", "min": 1}; expected a mapping with figure (one of'),
        ({"bench_api_url": "http://h:8000/v1"},
         'bench_api_url is "http://h:8000/v1"; expected "" (derived) or scheme://host:port without a path'),
    ],
)
def test_bad_variables_are_refused(tmp_path, extra, message):
    run = _play(tmp_path, extra)
    assert run.returncode != 0
    assert message in " ".join(run.stdout.split()), run.stdout[-3000:]
    assert not (tmp_path / "results").exists()


def test_a_service_that_is_not_ready_is_refused_before_any_load(tmp_path):
    run = _play(tmp_path, {})
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert "bench: refused, no load sent: the service on bench-local is not ready" in out, run.stdout[-3000:]
    assert "Start the generator" not in out and not (tmp_path / "results").exists()


def test_the_side_by_side_is_refused_without_llama_server_or_gpus(tmp_path):
    run = _play(tmp_path, {"bench_llama_cpp": True, "bench_llama_cpp_binary": str(tmp_path / "llama-server")})
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert (f"the side-by-side with llama.cpp (bench_llama_cpp) is refused on bench-local: bench_llama_cpp_binary "
            f"{tmp_path / 'llama-server'} is missing") in out, run.stdout[-3000:]
    gguf = tmp_path / "m-00001-of-00002.gguf"
    gguf.write_bytes(b"GGUF")
    run = _play(tmp_path, {"bench_llama_cpp": True, "bench_llama_cpp_binary": "/bin/true",
                           "bench_llama_cpp_gguf": str(gguf), "glm5_gpu_required": False})
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert "refused on bench-local: no GPU to hand to llama-server (glm5_gpu_required False" in out, run.stdout[-3000:]
    assert "Nothing was sent and vLLM was not stopped" in out


def test_several_bad_values_are_each_named_on_their_own_line(tmp_path):
    run = _play(tmp_path, {"bench_regression_pct": -5, "bench_max_prompts": 0,
                           "bench_profiles": {"p": {"kind": "burst", "input_len": 64, "output_len": 8}},
                           "bench_run_profiles": ["p"]})
    assert run.returncode != 0
    out = run.stdout
    # One refusal, one line per bad value, and only those (no line for what was fine).
    refusal = out[out.index("Refuse the settings that failed a check"):]
    lines = [line.strip() for line in refusal.splitlines()]
    assert any(line.endswith("bench_regression_pct is -5; expected a percentage >= 0, such as 10") for line in lines)
    assert any(line.endswith("bench_max_prompts is 0; expected a whole number >= 1") for line in lines)
    assert any(line.endswith('bench_profiles.p.kind is "burst"; expected concurrency, context or prefill')
               for line in lines), refusal[:2000]
    assert "input_len" not in refusal and "bench_api_url" not in refusal, refusal[:2000]
    assert not (tmp_path / "results").exists()
