"""Role model with source local, run whole by ansible-playbook against localhost: a
copied shard whose bytes were changed afterwards (one byte flipped, its size and mtime put
back, as a disk error or a hand would leave it) is hashed again and refused naming the
file, with nothing left that vouches for it; the manifest is never rewritten from the disk.

The converged state before it (the files copied, owner and mode set, every sha256 in the
stat cache) is made by the role's own modules in this process, so that one run of the
role, the one under test, is all this costs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from adhoc import call_module
from load_file import load_role_module

ROOT = Path(__file__).resolve().parents[2]
QUANT = "UD-Q4_K_XL"
copy_mod = load_role_module("roles/model/library/glm5_model_copy.py")
verify_mod = load_role_module("roles/model/library/glm5_model_verify.py")
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: model
"""


def _source(tmp: Path) -> Path:
    """A local source laid out as role model wants it, with its SHA256SUMS."""
    src = tmp / "src"
    (src / "gguf" / QUANT).mkdir(parents=True)
    (src / "base").mkdir()
    for i in (1, 2):
        (src / "gguf" / QUANT / f"GLM-5-{QUANT}-0000{i}-of-00002.gguf").write_bytes(os.urandom((1 << 20) + i))
    (src / "base" / "config.json").write_text(json.dumps({"num_attention_heads": 64, "index_topk": 2048}))
    (src / "base" / "tokenizer.json").write_text("{}\n")
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(src).as_posix()}\n"
                   for p in sorted(src.rglob("*")) if p.is_file())
    (src / "SHA256SUMS").write_text(sums)
    return src


def _converged(tmp: Path, src: Path) -> None:
    """The model directory as a run of the role leaves it (tasks/local.yml, owner.yml, verify.yml)."""
    model = tmp / "model"
    for sub in ("gguf", "base"):  # tasks/main.yml makes them
        (model / sub).mkdir(parents=True)
    copied = call_module(copy_mod, {"src": str(src), "dest": str(model), "manifest": str(src / "SHA256SUMS"),
                                    "owner": "root", "group": "root"})
    assert not copied.get("failed") and copied["changed"], copied
    for path in model.rglob("*"):
        path.chmod(0o750 if path.is_dir() else 0o640)
    model.chmod(0o750)
    (tmp / "state").mkdir(mode=0o700)
    verified = call_module(verify_mod, {"manifests": [{"path": str(src / "SHA256SUMS"), "root": str(model)}],
                                        "cache": str(tmp / "state" / "verified.json")})
    assert not verified.get("failed") and len(verified["hashed"]) == 4, verified


def _play(tmp: Path, src: Path) -> tuple[int, dict[str, Any]]:
    play = tmp / "local.yml"
    play.write_text(PLAYBOOK)
    extra = {"model_source": "local", "model_local_dir": str(src), "model_dir": str(tmp / "model"),
             "model_state_dir": str(tmp / "state"), "model_owner": "root", "model_group": "root",
             "glm5_progress_interval": 1, "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", HOME=str(tmp / "home"), ANSIBLE_CACHE_PLUGIN="memory")
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-e",
                           json.dumps(extra), str(play)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    return proc.returncode, json.loads(proc.stdout)


def _failures(out: dict[str, Any]) -> list[str]:
    return [str(h.get("msg", "")) for p in out["plays"] for t in p["tasks"] for h in t["hosts"].values()
            if h.get("failed")]


def _results(out: dict[str, Any], task: str) -> list[dict[str, Any]]:
    return [h for p in out["plays"] for t in p["tasks"]
            if t["task"]["name"].rpartition(" : ")[2] == task for h in t["hosts"].values()]


def test_a_flipped_byte_in_a_copied_shard_is_refused_naming_it(tmp_path: Path) -> None:
    src = _source(tmp_path)
    _converged(tmp_path, src)
    shard = tmp_path / "model" / "gguf" / QUANT / f"GLM-5-{QUANT}-00002-of-00002.gguf"
    good = shard.read_bytes()
    st = shard.stat()
    with shard.open("r+b") as fh:
        fh.seek(st.st_size // 2)
        fh.write(bytes([good[st.st_size // 2] ^ 0xFF]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    sums = (src / "SHA256SUMS").read_bytes()
    rc, bad = _play(tmp_path, src)
    failures = _failures(bad)
    assert rc != 0 and len(failures) == 1, failures
    assert f"{shard}: sha256 " in failures[0] and "the manifest says" in failures[0], failures
    assert "Remove it and run again: it is copied again from model_local_dir" in failures[0]
    assert [r["to_copy"] for r in _results(bad, "Find what to copy from the local directory")] == [[]]
    plan = _results(bad, "Look up the files in the stat cache of verified hashes (hashes nothing)")
    assert [r["to_hash"] for r in plan] == [[str(shard)]], "only the changed shard is hashed again"
    # Nothing vouches for it afterwards (so the next run refuses it again: the module's
    # tests): neither the stat cache nor a manifest rewritten from the disk; the role left
    # the refused file as it found it.
    assert (src / "SHA256SUMS").read_bytes() == sums
    cached = json.loads((tmp_path / "state" / "verified.json").read_text())["files"]
    assert str(shard) not in cached and len(cached) == 3
    assert shard.read_bytes() != good and shard.stat().st_size == len(good)
