"""tools/gpu/run on this machine, without a GPU: the serving and measuring steps that do
not need one, end to end.

The ml-env's `vllm serve` is the project's vllm_probe_standin (TEST DOUBLE: no GPU here;
its figures measure the double) and nvidia-smi a double answering an H100's memory;
everything else is what the GPU machine runs: the command line rendered with role
vllm_service's template and the context bound of its filter (tools/gpu/render.yml),
the unit started by the systemctl stand-in, playbooks/bench.yml over a local connection
driving the real `vllm bench serve` of vLLM 0.20.2, the report, collect and the table row,
and the unit stopped. Minutes on the 2-core machine, so it runs only when asked
(GLM5_SLICE_DRYRUN=1), e.g. before a GPU session.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from glm5_tools.fixtures import slice as sl

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(os.environ.get("GLM5_SLICE_DRYRUN") != "1",
                                reason="minutes long: set GLM5_SLICE_DRYRUN=1 to run it")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_bench_collect_stop(tmp_path: Path):
    # the unit's cache directory (role vllm_service's), which the stand-in writes to
    cache = Path("/var/cache/vllm-glm-5")
    cache_was_there = cache.exists()
    try:
        _serve_bench_collect_stop(tmp_path)
    finally:
        if not cache_was_there:
            shutil.rmtree(cache, ignore_errors=True)


def _serve_bench_collect_stop(tmp_path: Path) -> None:
    slice_dir = tmp_path / "slice"
    sl.make(slice_dir, 1, dense_layers=0, experts=8, vocab_size=1024, jobs=2)
    g = tmp_path / "gpu"
    (g / "ml-env" / "bin").mkdir(parents=True)
    vllm = g / "ml-env" / "bin" / "vllm"
    vllm.write_text(f"""#!/bin/sh
if [ "$1" = serve ]; then shift; exec {REPO}/.venv/bin/python {REPO}/src/glm5_tools/probe/standin.py serve "$@"; fi
exec {REPO}/.venv-ml/bin/vllm "$@"
""")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho '81559 MiB'\n")
    for f in (vllm, fake / "nvidia-smi"):
        f.chmod(0o755)
    (g / "machine.json").write_text(json.dumps({"name": "NVIDIA H100 80GB HBM3", "copy_GBps": 3000.0}))
    (g / "key").write_text("dry-run-key\n")
    (g / "versions.txt").write_text("dry run\n")
    out = tmp_path / "out"
    env = dict(os.environ, GPU_ROOT=str(g), GPU_PYTHON=str(REPO / ".venv" / "bin" / "python"),
               SLICE_DIR=str(slice_dir), SLICE_PORT=str(_free_port()), OUT=str(out), BUDGET_S="3000",
               PATH=f"{fake}:{os.environ['PATH']}")
    proc = subprocess.run([str(REPO / "tools" / "gpu" / "run"), "serve:vllm", "bench:quick", "collect", "stop"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    cmdline = (g / "results" / "vllm-mtp0" / "cmdline.sh").read_text()
    for word in ("export GLM5_GGUF_KERNELS=vllm", "--attention-backend TRITON_MLA_SPARSE", "--max-model-len 202752",
                 "--tensor-parallel-size 1", "--profiler-config"):
        assert word in cmdline, word
    assert "--enforce-eager" not in cmdline  # CUDA graphs, as the unit
    results = json.loads((g / "results" / "vllm-mtp0" / "results.json").read_text())
    points = results["bench"][0]["points"]
    assert [p["concurrency"] for p in points] == [1, 16] and all(p["figures"]["failed"] == 0 for p in points)
    summary = (out / "summary.md").read_text()
    assert "| vllm | 0 | 1 of 78 |" in summary
    assert {"results.tar.gz", "summary.md", "run.log", "logs.tar.gz"} <= {p.name for p in out.iterdir()}
    assert not list((g / "units").glob("*.pid"))  # the unit stopped
