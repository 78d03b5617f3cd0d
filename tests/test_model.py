"""Post-deploy checks of the model files (role model)."""

from __future__ import annotations

import json
import os
import re

from conftest import ansible_var

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
    """Role model's stat cache of verified hashes (root only) vouches for every shard with
    the sha256 its manifest names, and for the shard as it is on the disk now (size,
    mtime, ctime, inode): a shard changed since its last verification fails here."""
    state = ansible_var(host, "model_state_dir", "/var/lib/glm5/model") or "/var/lib/glm5/model"
    cache = host.file(f"{state}/verified.json")
    assert cache.exists, "role model recorded no verification"
    assert cache.user == "root" and cache.mode & 0o077 == 0
    files = json.loads(cache.content_string)["files"]
    manifests = {}
    for sub in ("gguf", "base"):
        path = host.file(f"{MODEL_DIR}/{sub}/.glm5-manifest.json")
        if path.exists:
            manifests.update({f"{MODEL_DIR}/{sub}/{e['path']}": e["sha256"] for e in json.loads(path.content_string)})
    for f in _ggufs(host):
        entry = files.get(f)
        assert entry, f"{f} is not recorded as verified"
        if f in manifests:
            assert entry["sha256"] == manifests[f]
        st = host.run(f"stat -c '%s %Y %Z %i' {f}").stdout.split()
        assert [str(entry["size"]), str(entry["mtime_ns"] // 10**9), str(entry["ctime_ns"] // 10**9),
                str(entry["ino"])] == st, f"{f} changed since it was verified"


def test_service_uses_first_shard(host):
    files = _ggufs(host)
    units = host.run("ls /etc/systemd/system/ | grep -E '^vllm-.*\\.service$'").stdout.split()
    assert units
    text = host.file(f"/etc/systemd/system/{units[0]}").content_string
    assert files[0] in text
