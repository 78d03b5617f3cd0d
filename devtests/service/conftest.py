"""Fixtures of the service/model devtests: ansible-runner against this machine
(connection local) in check mode, so that even a validation bug changes nothing; the
events still say which task would have changed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
from runner_events import Run

ROOT = Path(__file__).resolve().parents[2]
# GLM-5's keys that the service reads from config.json (heads for the TP check; the
# attention sizes and max_position_embeddings for the sparse context bound).
GLM5_ATTENTION_CONFIG = {
    "num_attention_heads": 64,
    "index_topk": 2048,
    "num_hidden_layers": 78,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "index_head_dim": 128,
    "max_position_embeddings": 202752,
}
PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"
# The typed package under src/ (not installed into the tool venv).
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


@pytest.fixture
def run_local(tmp_path: Path):
    def _run(playbook: str, extravars: dict[str, Any], *, check: bool = True) -> Run:
        # a private data dir per run: one test may run several playbooks
        private = tmp_path / f"runner{len(list(tmp_path.glob('runner*')))}"
        private.mkdir()
        inventory = {"all": {"children": {"gpu_servers": {"hosts": {"localhost": {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }}}}}}
        result = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(PLAYBOOKS / playbook),
            inventory=inventory,
            extravars={"glm5_gpu_required": False, **extravars},
            cmdline="--check" if check else None,
            envvars={
                "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                "ANSIBLE_CACHE_PLUGIN": "memory",
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            },
            quiet=True,
        )
        return Run(rc=result.rc, events=list(result.events))

    return _run


@pytest.fixture
def model_files(tmp_path: Path) -> dict[str, str]:
    """A model layout (placeholder files) and the service variables pointing at it."""
    base = tmp_path / "model" / "base"
    gguf = tmp_path / "model" / "gguf" / "UD-Q4_K_XL"
    base.mkdir(parents=True)
    gguf.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps(GLM5_ATTENTION_CONFIG))
    (base / "chat_template.jinja").write_text("{{ messages }}\n")
    for i in (1, 2):
        (gguf / f"GLM-5-UD-Q4_K_XL-0000{i}-of-00002.gguf").write_bytes(b"GGUF placeholder")
    return {
        "vllm_service_gguf_path": str(gguf / "GLM-5-UD-Q4_K_XL-00001-of-00002.gguf"),
        "vllm_service_tokenizer_dir": str(base),
        "vllm_service_hf_config_dir": str(base),
        "vllm_service_chat_template": str(base / "chat_template.jinja"),
        "vllm_service_api_key": "devtest-key",
        "vllm_service_validate_args": False,
        "vllm_service_port": 18777,
    }
