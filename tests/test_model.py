"""Post-deploy checks of the model files (role model)."""

from __future__ import annotations

import json
import os
import re

MODEL_DIR = os.environ.get("GLM5_MODEL_DIR", "/srv/models/glm-5")
SHARD = re.compile(r"-(\d+)-of-(\d+)\.gguf$")


def _ggufs(host) -> list[str]:
    out = host.run(f"find {MODEL_DIR}/gguf -name '*.gguf' -type f").stdout.split()
    return sorted(out)


def test_model_dir_readable_by_service_group(host):
    d = host.file(MODEL_DIR)
    assert d.is_directory
    assert d.group == "vllm"
    assert d.mode & 0o050 == 0o050
    assert d.mode & 0o007 == 0


def test_shard_set_complete(host):
    files = _ggufs(host)
    assert files, f"no GGUF under {MODEL_DIR}/gguf"
    sharded = [f for f in files if SHARD.search(f)]
    if sharded:
        total = int(SHARD.search(sharded[0]).group(2))
        assert len(sharded) == total


def test_base_files_present(host):
    config = json.loads(host.file(f"{MODEL_DIR}/base/config.json").content_string)
    assert config.get("num_attention_heads")
    assert host.file(f"{MODEL_DIR}/base/tokenizer_config.json").exists
    assert host.file(f"{MODEL_DIR}/base/chat_template.jinja").exists


def test_files_verified_against_manifest(host):
    stamps = host.run(f"find {MODEL_DIR} -maxdepth 2 -name .glm5-verified.json").stdout.split()
    assert stamps, "role model recorded no verification"
    verified: set[str] = set()
    for stamp in stamps:
        verified |= set(json.loads(host.file(stamp).content_string))
    for f in _ggufs(host):
        rel = f[len(MODEL_DIR) + 1:]
        assert rel in verified or rel.split("/", 1)[1] in verified, f


def test_service_uses_first_shard(host):
    files = _ggufs(host)
    units = host.run("ls /etc/systemd/system/ | grep -E '^vllm-.*\\.service$'").stdout.split()
    assert units
    text = host.file(f"/etc/systemd/system/{units[0]}").content_string
    assert files[0] in text
