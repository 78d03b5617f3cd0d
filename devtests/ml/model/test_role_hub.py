"""Role model with source hub (the Ansible side: environment, no_log, changed_when, the
failure report, then verify and layout) run by ansible-playbook against localhost with .venv-ml's python as
the ml-env, fetching from fake_hf_hub (a TEST DOUBLE of the Hugging Face Hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import BASE_REPO, GGUF_REPO, ROOT, TOKEN, Hub

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: model
"""


def _play(hub: Hub, tmp_path: Path, token: str, check: bool = False,
          verbose: bool = False) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "hub.yml"
    play.write_text(PLAYBOOK)
    model_dir = tmp_path / "model"
    for sub in ("gguf", "base"):
        (model_dir / sub).mkdir(parents=True, exist_ok=True)
    extra = {"model_dir": str(model_dir), "ml_env_python": sys.executable, "model_hf_endpoint": hub.url,
             "model_hf_token": token, "model_owner": "root", "model_group": "root", "model_base_repo": BASE_REPO,
             "model_gguf_repo": GGUF_REPO, "model_disk_headroom_bytes": 0, "glm5_no_proxy": "127.0.0.1,localhost",
             "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ANSIBLE_"))}
    env.update(ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="default" if verbose else "ansible.posix.json", HOME=str(tmp_path / "home"),
               # the model role caches its facts: keep them out of the repository's fact cache
               ANSIBLE_CACHE_PLUGIN="memory")
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(extra), str(play)]
    cmd += ["--check"] if check else []
    cmd += ["-vvv"] if verbose else []
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def _stats(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    stats: dict[str, int] = json.loads(proc.stdout)["stats"]["localhost"]
    return stats


def test_role_fetches_then_changes_nothing(hub: Hub, tmp_path: Path) -> None:
    first = _play(hub, tmp_path, TOKEN)
    assert first.returncode == 0, first.stdout[-3000:]
    assert _stats(first)["changed"] >= 1
    for sub in ("gguf", "base"):
        manifest = json.loads((tmp_path / "model" / sub / ".glm5-manifest.json").read_text())
        assert manifest and all(e["sha256"] for e in manifest)
        stamp = tmp_path / "model" / sub / ".glm5-verified.json"
        assert set(json.loads(stamp.read_text())) == {e["path"] for e in manifest}
        assert stamp.stat().st_mode & 0o777 == 0o640
    again = _play(hub, tmp_path, TOKEN)
    assert again.returncode == 0 and _stats(again)["changed"] == 0, again.stdout[-3000:]
    checked = _play(hub, tmp_path, TOKEN, check=True)
    assert checked.returncode == 0 and _stats(checked)["changed"] == 0, checked.stdout[-3000:]


def test_role_reports_a_refused_token_without_showing_it(hub: Hub, tmp_path: Path) -> None:
    wrong = "hf_wrong_role_token_987654321"
    proc = _play(hub, tmp_path, wrong)
    assert proc.returncode != 0
    assert wrong not in proc.stdout and wrong not in proc.stderr
    out = json.loads(proc.stdout)
    msgs = [h.get("msg", "") for p in out["plays"] for t in p["tasks"] for h in t["hosts"].values() if h.get("failed")]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("model: fetching from http://127.0.0.1:")
    assert f"{GGUF_REPO}: the hub rejected the token (model_hf_token)" in msgs[0]
    assert f"; {BASE_REPO}: the hub rejected the token" in msgs[0]


def test_token_never_in_vvv_output(hub: Hub, tmp_path: Path) -> None:
    """The token never in -vvv output (failing first: the token went through the task's environment:,
    which Ansible puts on the EXEC line -vvv prints, no_log or not). Both a refused and
    an accepted token: absent from the whole -vvv output."""
    wrong = "hf_wrong_vvv_token_123456789"
    refused = _play(hub, tmp_path, wrong, verbose=True)
    assert refused.returncode != 0 and "EXEC" in refused.stdout + refused.stderr
    assert wrong not in refused.stdout + refused.stderr
    accepted = _play(hub, tmp_path, TOKEN, verbose=True)
    assert accepted.returncode == 0, accepted.stdout[-3000:]
    assert TOKEN not in accepted.stdout + accepted.stderr
