"""The unit's ExecStart arguments, rendered by Ansible from role vllm_service's own
defaults, are accepted by the real vLLM 0.20.2 argument parser (.venv-ml), and the
role's checker (roles/vllm_service/files/vllm_argcheck.py) refuses what 0.20.2 does not
know. Run with the ml venv: .venv-ml/bin/pytest devtests/ml/service/"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"
CHECKER = ROOT / "roles" / "vllm_service" / "files" / "vllm_argcheck.py"

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


def _render_args(tmp_path: Path, **extra: object) -> list[str]:
    """vllm_service_serve_args as the role computes it (defaults + vars + model facts)."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    facts = {
        "model_gguf_path": str(tmp_path / "GLM-5-UD-Q4_K_XL-00001-of-00010.gguf"),
        "model_tokenizer_dir": str(base),
        "model_config_dir": str(base),
        "model_chat_template_path": str(base / "chat_template.jinja"),
        **extra,
    }
    cmd = [
        str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,", "-o",
        "-m", "ansible.builtin.debug", "-a", "var=vllm_service_serve_args",
        "-e", "@roles/glm5/defaults/main/site.yml",
        "-e", "@roles/vllm_service/defaults/main.yml",
        "-e", "@roles/vllm_service/vars/main.yml",
        "-e", json.dumps(facts),
    ]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CACHE_PLUGIN": "memory"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    payload = json.loads(out.split("=>", 1)[1])
    args = payload["vllm_service_serve_args"]
    assert isinstance(args, list)
    return [str(a) for a in args]


@pytest.fixture(scope="module")
def checker():
    """The role's checker, imported once into this process (vLLM imports are slow)."""
    os.environ["GLM5_ARGCHECK_PLATFORM"] = "cuda"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    namespace: dict[str, object] = {"__name__": "vllm_argcheck"}
    exec(compile(CHECKER.read_text(), str(CHECKER), "exec"), namespace)

    def _check(args: list[str], capsys) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = [str(CHECKER), json.dumps(args)]
        try:
            rc = namespace["main"]()  # type: ignore[operator]
        except SystemExit as exc:
            rc = int(exc.code or 0)
        finally:
            sys.argv = old
        captured = capsys.readouterr()
        return int(rc), captured.out, captured.err

    return _check


def test_rendered_args_parse_with_vllm(checker, tmp_path, capsys):
    args = _render_args(tmp_path)
    assert "--api-key" not in args, "the key belongs in the env file (VLLM_API_KEY)"
    rc, out, err = checker(args, capsys)
    assert rc == 0, err
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["attention_backend"] == "TRITON_MLA"
    assert parsed["tensor_parallel_size"] == 8
    assert parsed["max_model_len"] == 2048
    assert parsed["served_model_name"] == ["glm-5"]
    assert parsed["model"].endswith("-00001-of-00010.gguf")
    assert parsed["errors"] == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"vllm_service_extra_args": ["--no-such-flag"]}, "unrecognized arguments: --no-such-flag"),
        ({"vllm_service_attention_backend": "TRITON_MLA_TYPO"}, "attention-backend"),
        ({"vllm_service_reasoning_parser": "glm99"}, "glm99"),
    ],
    ids=["unknown-flag", "unknown-backend", "unknown-reasoning-parser"],
)
def test_checker_refuses(checker, tmp_path, capsys, extra, message):
    rc, _out, err = checker(_render_args(tmp_path, **extra), capsys)
    assert rc != 0
    assert message in err
