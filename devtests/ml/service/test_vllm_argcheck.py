"""The unit's ExecStart arguments, rendered by Ansible from role vllm_service's own
defaults, are accepted by the real vLLM 0.20.2 argument parser (.venv-ml), and the
role's checker (roles/vllm_service/files/vllm_argcheck.py) refuses what 0.20.2 does not
know. Run with the ml venv: .venv-ml/bin/pytest devtests/ml/service/

Failing first: the max_model_len guard checked the variable, so
`vllm_service_extra_args: [--max-model-len, "131072"]` passed. The checker now receives
the role's own arguments and the extra ones apart, refuses a guarded flag in the extra
ones in any spelling vLLM accepts, and compares every guarded setting of the parsed
namespace with what the role set (a --config file cannot override one either). Before
the fix these tests failed: the override cases exited 0, and the parsed values showed
max_model_len 131072 with no error."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from service_request import argcheck_request

ROOT = Path(__file__).resolve().parents[3]
CHECKER = ROOT / "roles" / "vllm_service" / "files" / "vllm_argcheck.py"

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


def _render_args(tmp_path: Path, **extra: object) -> dict[str, object]:
    """vllm_service_argcheck_request as the role computes it (defaults + vars + model facts)."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    facts = {
        # This venv's vLLM is unpatched (no TRITON_MLA_SPARSE): the dense service here;
        # the sparse default is checked on the patched tree (devtests/ml/patches).
        "vllm_service_attention": "dense",
        "model_gguf_path": str(tmp_path / "GLM-5-UD-Q4_K_XL-00001-of-00010.gguf"),
        "model_tokenizer_dir": str(base),
        "model_config_dir": str(base),
        "model_chat_template_path": str(base / "chat_template.jinja"),
        **extra,
    }
    return argcheck_request(facts)


@pytest.fixture(scope="module")
def checker():
    """The role's checker, imported once into this process (vLLM imports are slow)."""
    os.environ["GLM5_ARGCHECK_PLATFORM"] = "cuda"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    namespace: dict[str, object] = {"__name__": "vllm_argcheck"}
    exec(compile(CHECKER.read_text(), str(CHECKER), "exec"), namespace)

    def _check(request: dict[str, object], capsys) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = [str(CHECKER), json.dumps(request)]
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
    request = _render_args(tmp_path)
    assert "--api-key" not in request["role_args"], "the key belongs in the env file (VLLM_API_KEY)"
    rc, out, err = checker(request, capsys)
    assert rc == 0, err
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["attention_backend"] == "TRITON_MLA"
    assert parsed["tensor_parallel_size"] == 8
    assert parsed["max_model_len"] == 2048
    assert parsed["served_model_name"] == ["glm-5"]
    assert parsed["model"].endswith("-00001-of-00010.gguf")
    # GLM-5's recipe renders message content as a plain string.
    assert parsed["chat_template_content_format"] == "string"
    assert parsed["host"] == "127.0.0.1"
    assert parsed["port"] == 8000
    assert parsed["speculative_config"] is None  # MTP off by default (vllm_service_mtp_tokens 0)
    assert parsed["errors"] == []


@pytest.mark.parametrize("tokens", [1, 3])
def test_mtp_tokens_render_a_speculative_config_vllm_parses(checker, tmp_path, capsys, tokens):
    request = _render_args(tmp_path, vllm_service_mtp_tokens=tokens)
    rc, out, err = checker(request, capsys)
    assert rc == 0, err
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["speculative_config"] == {"method": "mtp", "num_speculative_tokens": tokens}



def test_dense_kv_cache_dtype_fp8_renders_and_parses(checker, tmp_path, capsys):
    """vllm_service_kv_cache_dtype renders --kv-cache-dtype (not when auto); the dense
    path takes vLLM's own fp8 cache. The sparse fp8 cache (patch 0013) is checked on the
    patched tree (devtests/ml/patches/test_triton_sparse_mla_fp8.py)."""
    assert "--kv-cache-dtype" not in _render_args(tmp_path)["role_args"]
    request = _render_args(tmp_path, vllm_service_kv_cache_dtype="fp8")
    args = request["role_args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    rc, out, err = checker(request, capsys)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["kv_cache_dtype"] == "fp8"

def test_extra_args_cannot_repeat_the_roles_speculative_config(checker, tmp_path, capsys):
    request = _render_args(tmp_path, vllm_service_mtp_tokens=1,
                           vllm_service_extra_args=["--speculative-con", '{"method":"ngram"}'])
    rc, out, err = checker(request, capsys)
    assert rc == 2, out
    assert "vllm_service_extra_args sets --speculative-config " in err


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


@pytest.mark.parametrize(
    ("extra_args", "flag"),
    [
        (["--max-model-len", "131072"], "--max-model-len"),
        (["--max_model_len=131072"], "--max-model-len"),
        (["--max-model", "131072"], "--max-model-len"),
        (["-tp", "4"], "--tensor-parallel-size"),
        (["--attention-backend", "FLASH_ATTN"], "--attention-backend"),
        (["--host", "0.0.0.0"], "--host"),
        (["--port=9000"], "--port"),
        (["--served-model-name", "other"], "--served-model-name"),
        (["--api-key", "on-the-command-line"], "--api-key"),
        (["--chat-template-content-format", "openai"], "--chat-template-content-format"),
        (["--max-model-len", "2048"], "--max-model-len"),
    ],
    ids=[
        "max-model-len",
        "underscore-equals",
        "abbreviation",
        "tp-short",
        "backend",
        "host",
        "port",
        "served-name",
        "api-key",
        "content-format",
        "same-value-still-refused",
    ],
)
def test_extra_args_cannot_set_a_guarded_flag(checker, tmp_path, capsys, extra_args, flag):
    """The role sets these from its own variables; extra_args repeating one is refused."""
    rc, out, err = checker(_render_args(tmp_path, vllm_service_extra_args=extra_args), capsys)
    assert rc == 2, out
    assert f"vllm_service_extra_args sets {flag} " in err


def test_config_file_cannot_set_a_guarded_setting(checker, tmp_path, capsys):
    """vLLM's --config YAML is parsed into the same namespace: the parsed value decides.
    A key the role keeps off the command line (the API key) is refused..."""
    config = tmp_path / "serve.yaml"
    config.write_text("api-key: leaked-into-a-config-file\n")
    rc, out, err = checker(_render_args(tmp_path, vllm_service_extra_args=["--config", str(config)]), capsys)
    assert rc == 2, out
    assert "api_key" in err and "vllm_service_api_key" in err
    assert "leaked" not in out + err, "the checker must not print the key"


def test_config_file_does_not_beat_the_role_flags(checker, tmp_path, capsys):
    """...and one the role sets on the command line stays the role's (vLLM: CLI > config)."""
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 131072\n")
    rc, out, err = checker(_render_args(tmp_path, vllm_service_extra_args=["--config", str(config)]), capsys)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["max_model_len"] == 2048


@pytest.mark.parametrize(("allow", "accepted"), [(False, False), (True, True)], ids=["refused", "allowed"])
def test_parsed_max_model_len_above_index_topk(checker, tmp_path, capsys, allow, accepted):
    """The cap is applied to what vLLM parsed, not only to the variable."""
    rc, out, err = checker(
        _render_args(tmp_path, vllm_service_max_model_len=4096, vllm_service_allow_long_context=allow), capsys
    )
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["max_model_len"] == 4096
    if accepted:
        assert rc == 0, err
    else:
        assert rc == 2
        assert "max_model_len 4096 exceeds index_topk 2048" in err


def test_unguarded_extra_args_accepted(checker, tmp_path, capsys):
    rc, _out, err = checker(
        _render_args(tmp_path, vllm_service_extra_args=["--enable-prefix-caching", "--max-num-seqs", "16"]), capsys
    )
    assert rc == 0, err
