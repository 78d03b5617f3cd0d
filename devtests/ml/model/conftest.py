"""fake_hf_hub (a TEST DOUBLE of the Hugging Face Hub, molecule/fixtures/fake_hf_hub/)
served in-process on a free port, over a tree laid out as the two repositories role
model fetches; and a runner of the role's real roles/model/files/hf_fetch.py with
.venv-ml's python (the real huggingface_hub 0.36.2 of the production lock)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[3]
HF_FETCH = ROOT / "roles" / "model" / "files" / "hf_fetch.py"
TINY = ROOT / ".cache" / "fixtures" / "tiny-glm5"
TOKEN = "hf_fake_hub_test_token_not_a_secret"
GGUF_REPO = "unsloth/GLM-5-GGUF"
BASE_REPO = "zai-org/GLM-5"
QUANT = "UD-Q4_K_XL"
GGUF_PATTERNS = [f"*{QUANT}*.gguf"]
BASE_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja"]
# huggingface_hub reads 10 MiB chunks: an abort must come after the first one for a
# partial file to remain (and be resumed).
ABORT_AT = 12 * 1024 * 1024

pytest.importorskip("huggingface_hub")
pytestmark = pytest.mark.slow


def _load_fake_hub() -> ModuleType:
    return load_file(ROOT / "molecule" / "fixtures" / "fake_hf_hub" / "fake_hf_hub.py")


fake_hf_hub = _load_fake_hub()


def _lay_out(root: Path) -> None:
    """The two repositories: split GGUF shards (the tiny GLM-5's, else generated files
    big enough to be read in more than one chunk) and the base files."""
    gguf = root / GGUF_REPO / QUANT
    base = root / BASE_REPO
    gguf.mkdir(parents=True)
    base.mkdir(parents=True)
    shards = sorted((TINY / "gguf" / "split").glob(f"*{QUANT}-*-of-*.gguf"))
    if shards:
        for shard in shards:
            target = gguf / shard.name.replace("tiny-glm5", "GLM-5")
            try:
                os.link(shard, target)  # read only: the tests never write the served tree
            except OSError:
                shutil.copy(shard, target)
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TINY / "hf" / name, base / name)
    else:
        for i in (1, 2):
            (gguf / f"GLM-5-{QUANT}-0000{i}-of-00002.gguf").write_bytes(os.urandom(20 * 1024 * 1024 + i))
        (base / "config.json").write_text(json.dumps({"num_attention_heads": 64, "index_topk": 2048}))
        (base / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
        (base / "tokenizer_config.json").write_text("{}\n")
    (base / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    # Served but not fetched: the allow patterns must leave these out.
    (base / "README.md").write_text("# GLM-5 (fake_hf_hub test repository)\n")
    (root / GGUF_REPO / "BF16").mkdir()
    (root / GGUF_REPO / "BF16" / "GLM-5-BF16-00001-of-00001.gguf").write_bytes(b"GGUF not fetched\n")


@dataclass
class Hub:
    hub: Any
    url: str

    def requests(self, method: str | None = None, prefix: str = "") -> list[dict[str, Any]]:
        return [e for e in self.hub.log if (method is None or e["method"] == method)
                and e["path"].startswith(prefix)]

    def served(self, repo: str) -> dict[str, Any]:
        got = self.hub.repo(repo)
        assert got is not None
        return got.files


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    root = tmp_path / "hub"
    _lay_out(root)
    state = fake_hf_hub.FakeHub(root=root, tokens=frozenset([TOKEN]), gated=frozenset([BASE_REPO]))
    server = fake_hf_hub.serve(state, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Hub(state, f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Fetched:
    rc: int
    result: dict[str, Any]
    stdout: str
    stderr: str


def fetch_command(hub: Hub, tmp_path: Path, repo: str, local: Path, *, token: str | None = TOKEN,
                  headroom: int = 0, extra: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of roles/model/files/hf_fetch.py as role model runs it."""
    local.mkdir(parents=True, exist_ok=True)
    patterns = GGUF_PATTERNS if repo == GGUF_REPO else BASE_PATTERNS
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    if token is not None:
        env["HF_TOKEN"] = token
    cmd = [sys.executable, str(HF_FETCH), "--repo", repo, "--revision", "main", "--local-dir", str(local),
           "--manifest", str(local / ".glm5-manifest.json"), "--headroom", str(headroom),
           "--allow-patterns", json.dumps(patterns), *(extra or [])]
    return cmd, env


def run_fetch(hub: Hub, tmp_path: Path, repo: str, local: Path, *, token: str | None = TOKEN,
              headroom: int = 0, extra: list[str] | None = None) -> Fetched:
    """roles/model/files/hf_fetch.py as role model runs it (tasks/hub_fetch.yml)."""
    cmd, env = fetch_command(hub, tmp_path, repo, local, token=token, headroom=headroom, extra=extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"hf_fetch.py must print one line, printed: {proc.stdout!r} (stderr {proc.stderr})"
    return Fetched(proc.returncode, json.loads(lines[0]), proc.stdout, proc.stderr)
