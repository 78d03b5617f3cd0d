"""Role model with source hub (the Ansible side: environment, no_log, changed_when, the
failure report, then verify and layout) run by ansible-playbook against localhost with .venv-ml's python as
the ml-env, fetching from fake_hf_hub (a TEST DOUBLE of the Hugging Face Hub)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
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


def _command(hub: Hub, tmp_path: Path, token: str, check: bool = False,
             verbose: bool = False) -> tuple[list[str], dict[str, str]]:
    play = tmp_path / "hub.yml"
    play.write_text(PLAYBOOK)
    model_dir = tmp_path / "model"
    for sub in ("gguf", "base"):
        (model_dir / sub).mkdir(parents=True, exist_ok=True)
    extra = {"model_dir": str(model_dir), "ml_env_python": sys.executable, "model_hf_endpoint": hub.url,
             "model_hf_token": token, "model_owner": "root", "model_group": "root", "model_base_repo": BASE_REPO,
             "model_gguf_repo": GGUF_REPO, "model_disk_headroom_bytes": 0, "glm5_no_proxy": "127.0.0.1,localhost",
             "model_state_dir": str(tmp_path / "state"), "glm5_progress_interval": 2,
             "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ANSIBLE_"))}
    env.update(ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="default" if verbose else "ansible.posix.json", HOME=str(tmp_path / "home"),
               # the model role caches its facts: keep them out of the repository's fact cache
               ANSIBLE_CACHE_PLUGIN="memory")
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(extra), str(play)]
    cmd += ["--check"] if check else []
    cmd += ["-vvv"] if verbose else []
    return cmd, env


def _play(hub: Hub, tmp_path: Path, token: str, check: bool = False,
          verbose: bool = False) -> subprocess.CompletedProcess[str]:
    cmd, env = _command(hub, tmp_path, token, check, verbose)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def _messages(proc: subprocess.CompletedProcess[str], task: str) -> list[str]:
    out = json.loads(proc.stdout)
    return [str(h.get("msg", "")) for p in out["plays"] for t in p["tasks"]
            if t["task"]["name"].rpartition(" : ")[2] == task for h in t["hosts"].values()]


def _round_lines(proc: subprocess.CompletedProcess[str], task: str) -> list[str]:
    """The lines of a task that loops in rounds (role glm5's tasks/follow.yml), one a round."""
    out = json.loads(proc.stdout)
    return [str(r["line"]) for p in out["plays"] for t in p["tasks"] if t["task"]["name"].rpartition(" : ")[2] == task
            for h in t["hosts"].values() for r in h.get("results", []) if "line" in r]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip(path: Path) -> None:
    """One byte flipped in place, the size and mtime put back."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(st.st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _stats(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    stats: dict[str, int] = json.loads(proc.stdout)["stats"]["localhost"]
    return stats


def test_role_reports_a_refused_token_without_showing_it(hub: Hub, tmp_path: Path) -> None:
    wrong = "hf_wrong_role_token_987654321"
    proc = _play(hub, tmp_path, wrong)
    assert proc.returncode != 0
    assert wrong not in proc.stdout and wrong not in proc.stderr
    out = json.loads(proc.stdout)
    msgs = [h.get("msg", "") for p in out["plays"] for t in p["tasks"] for h in t["hosts"].values() if h.get("failed")]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("model: fetching from http://127.0.0.1:")
    # The repositories are fetched one after the other: the first refusal stops the run.
    assert f"{GGUF_REPO}: the hub rejected the token (model_hf_token)" in msgs[0]
    assert "\n" not in msgs[0]


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


def test_sigkill_mid_fetch_then_rerun_resumes_and_verifies_then_changes_nothing(hub: Hub, tmp_path: Path) -> None:
    """The run and the fetch itself killed with SIGKILL half way through a shard's
    transfer (the worst case: no process left to finish anything); a rerun resumes the
    partial downloads, verifies every file against the hub's sha256 (the stat cache,
    root only, records them), the next run changes nothing, nor does check mode. Then a
shard corrupted in place (one byte, size and mtime put back) is fetched again and
verified."""
    hub.hub.blob_seconds = 30.0
    cmd, env = _command(hub, tmp_path, TOKEN)
    progress = tmp_path / "state" / "fetch-gguf.json"
    run = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        doc: dict = {}
        while time.monotonic() < deadline:
            try:
                doc = json.loads(progress.read_text())
            except (OSError, ValueError):
                doc = {}
            if 0 < doc.get("bytes_done", 0) < doc.get("bytes_total", 0) and doc.get("current"):
                break
            assert run.poll() is None, "the run ended before the fetch was half way"
            time.sleep(0.2)
        else:
            raise AssertionError(f"the fetch never got half way: {doc}")
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    os.kill(int(doc["pid"]), signal.SIGKILL)  # the fetch (an async job, outside the run's session)
    model = tmp_path / "model" / "gguf"
    partial = list((model / ".cache").rglob("*.incomplete"))
    assert any(p.stat().st_size > 0 for p in partial), "no partial download left to resume"
    hub.hub.blob_seconds = 0.0
    hub.hub.log.clear()
    again = _play(hub, tmp_path, TOKEN)
    assert again.returncode == 0, again.stdout[-3000:]
    assert _stats(again)["changed"] >= 1
    assert any(e["range"] and not e["range"].startswith("bytes=0-") for e in hub.requests("GET", "/_blobs/")), \
        "the rerun downloaded the shards from the start instead of resuming"
    lines = _round_lines(again, "Follow a background job, a line a round: model fetch")
    assert any("(resumed: " in line and "were already here" in line for line in lines), lines
    cache = tmp_path / "state" / "verified.json"
    cached = json.loads(cache.read_text())["files"]
    assert cache.stat().st_mode & 0o777 == 0o600
    for sub, repo in (("gguf", GGUF_REPO), ("base", BASE_REPO)):
        manifest = json.loads((tmp_path / "model" / sub / ".glm5-manifest.json").read_text())
        served = hub.served(repo)
        assert manifest and {e["path"] for e in manifest} <= set(served)
        for e in manifest:
            assert e["sha256"] == served[e["path"]].sha256
            assert cached[str(tmp_path / "model" / sub / e["path"])]["sha256"] == e["sha256"]
    third = _play(hub, tmp_path, TOKEN)
    assert third.returncode == 0 and _stats(third)["changed"] == 0, third.stdout[-3000:]
    assert any("unchanged since their last verified hash: not hashed again" in line
               for line in _messages(third, "Say that nothing needs hashing")), third.stdout[-3000:]
    checked = _play(hub, tmp_path, TOKEN, check=True)
    assert checked.returncode == 0 and _stats(checked)["changed"] == 0, checked.stdout[-3000:]

    # A shard's byte flipped, its size and mtime put back: hashed again (its ctime moved),
    # removed, fetched again from the hub and verified: repaired, never passed as it was.
    shard = sorted(model.rglob("*.gguf"))[-1]
    rel = shard.relative_to(model).as_posix()
    _flip(shard)
    hub.hub.log.clear()
    repaired = _play(hub, tmp_path, TOKEN)
    assert repaired.returncode == 0, repaired.stdout[-3000:]
    assert _sha256(shard) == hub.served(GGUF_REPO)[rel].sha256
    assert len(hub.requests("GET", "/_blobs/")) == 1, "only the differing shard is fetched again"
    said = _messages(repaired, "Report the verification")
    assert any(f"removed, to be fetched again: {shard}" in line for line in said), said
    # and noted as a repair, so that the run writes no no-op record (playbooks/record.yml)
    facts = [h["ansible_facts"]["glm5_integrity_repairs"] for p in json.loads(repaired.stdout)["plays"]
             for t in p["tasks"] if t["task"]["name"].endswith("Note the repair for the no-op record")
             for h in t["hosts"].values()]
    assert facts == [[f"model file {shard}"]], facts
