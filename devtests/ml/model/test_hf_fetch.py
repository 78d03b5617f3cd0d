"""Role model's hub path (roles/model/files/hf_fetch.py with the real huggingface_hub
0.36.2 of .venv-ml) against fake_hf_hub, a TEST DOUBLE of the Hugging Face Hub: full
download, manifest, no-op rerun, resume after an interrupted transfer, gated repository
with a wrong or missing token, the free-space refusal, and glm5_model_verify catching a
file corrupted afterwards. Run: PYTHONPATH=src .venv-ml/bin/python -m pytest devtests/ml/model"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from adhoc import run_module
from conftest import ABORT_AT, BASE_REPO, GGUF_REPO, QUANT, TOKEN, Hub, fetch_command, run_fetch


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(local: Path) -> dict[str, str]:
    """Fetched files (not the manifest nor huggingface_hub's .cache) and their sha256."""
    return {p.relative_to(local).as_posix(): _sha256(p) for p in sorted(local.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(local).parts and not p.name.startswith(".glm5")}


def _verify(local: Path) -> dict:
    """glm5_model_verify (the role's module) as an ad-hoc Ansible task."""
    got = run_module("model", "glm5_model_verify", {
        "manifests": [{"path": str(local / ".glm5-manifest.json"), "root": str(local)}],
        "cache": str(local.parent / f"verified-{local.name}.json")})
    return {"failed": bool(got.get("failed")), "changed": bool(got.get("changed")), "out": str(got.get("msg", ""))}


def test_full_download_manifest_equals_served(hub: Hub, tmp_path: Path) -> None:
    for repo, sub in ((GGUF_REPO, "gguf"), (BASE_REPO, "base")):
        local = tmp_path / "model" / sub
        got = run_fetch(hub, tmp_path, repo, local)
        assert got.rc == 0, got.result
        served = hub.served(repo)
        manifest = json.loads((local / ".glm5-manifest.json").read_text())
        fetched = {e["path"] for e in manifest}
        if repo == GGUF_REPO:
            want = {p for p in served if p.startswith(f"{QUANT}/")}
            assert len(want) == 2
        else:
            want = set(served) - {"README.md"}
        assert fetched == want
        for e in manifest:
            assert e["size"] == served[e["path"]].size
            assert e["sha256"] == served[e["path"]].sha256
        assert _files(local) == {p: served[p].sha256 for p in want}
        assert got.result == {"changed": True, "revision": hub.hub.repo(repo).sha, "files": len(want),
                              "bytes": sum(served[p].size for p in want), "downloaded": len(want),
                              "manifest_written": True}
    # The LFS shards came through the blob redirect; nothing outside the patterns was asked for.
    blobs = hub.requests("GET", "/_blobs/")
    assert len(blobs) == 2 and all(e["status"] == 200 for e in blobs)
    assert not [e for e in hub.hub.log if "BF16" in e["path"] or "README" in e["path"]]


def test_second_run_changes_nothing_and_downloads_nothing(hub: Hub, tmp_path: Path) -> None:
    local = tmp_path / "model" / "gguf"
    assert run_fetch(hub, tmp_path, GGUF_REPO, local).rc == 0
    before = {p: p.stat().st_mtime_ns for p in local.rglob("*.gguf")}
    hub.hub.log.clear()
    again = run_fetch(hub, tmp_path, GGUF_REPO, local)
    assert again.rc == 0
    assert again.result["changed"] is False and again.result["downloaded"] == 0
    assert [e["path"] for e in hub.hub.log] == [f"/api/models/{GGUF_REPO}/revision/main"]
    assert {p: p.stat().st_mtime_ns for p in local.rglob("*.gguf")} == before


def test_a_changed_small_file_is_fetched_again_and_the_manifest_comes_from_the_hub(hub: Hub,
                                                                                  tmp_path: Path) -> None:
    """A small (git) file of the same size whose git blob id differs from the hub's is
    fetched again, and a manifest edited on the disk is written again from the hub's
    digests: neither is taken from what the disk holds."""
    local = tmp_path / "model" / "base"
    assert run_fetch(hub, tmp_path, BASE_REPO, local).rc == 0
    manifest = local / ".glm5-manifest.json"
    good_manifest = manifest.read_text()
    config = local / "config.json"
    good = config.read_bytes()
    config.write_bytes(good.replace(b"{", b"[", 1))  # same size, other bytes
    entries = json.loads(good_manifest)
    for e in entries:
        if e["path"] == "config.json":
            e["sha256"] = _sha256(config)  # the manifest made to vouch for the edited file
    manifest.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    hub.hub.log.clear()
    again = run_fetch(hub, tmp_path, BASE_REPO, local)
    assert again.rc == 0, again.result
    assert again.result["downloaded"] == 1 and again.result["manifest_written"] is True
    assert again.result["changed"] is True
    assert config.read_bytes() == good
    assert manifest.read_text() == good_manifest
    assert [e["path"] for e in hub.requests("GET") if e["path"].endswith("/config.json")], hub.hub.log


def test_interrupted_download_resumes_with_a_range_request(hub: Hub, tmp_path: Path) -> None:
    hub.hub.abort_first_get = ABORT_AT
    local = tmp_path / "model" / "gguf"
    first = run_fetch(hub, tmp_path, GGUF_REPO, local)
    assert first.rc == 1 and first.result["failed"] is True
    assert "download failed" in first.result["msg"] and "\n" not in first.result["msg"]
    assert not list(local.rglob("*.gguf")), "no shard may be in place after an aborted transfer"
    partial = list((local / ".cache").rglob("*.incomplete"))
    assert partial and all(p.stat().st_size > 0 for p in partial)
    hub.hub.log.clear()
    second = run_fetch(hub, tmp_path, GGUF_REPO, local)
    assert second.rc == 0, second.result
    ranges = [e["range"] for e in hub.requests("GET", "/_blobs/")]
    assert ranges and all(r is not None and r.startswith("bytes=") and not r.startswith("bytes=0-")
                          for r in ranges), ranges
    served = hub.served(GGUF_REPO)
    assert _files(local) == {p: f.sha256 for p, f in served.items() if p.startswith(f"{QUANT}/")}
    assert all(e["status"] == 206 for e in hub.requests("GET", "/_blobs/"))


def test_gated_repo_wrong_or_missing_token_fails_clearly_and_keeps_files(hub: Hub, tmp_path: Path) -> None:
    local = tmp_path / "model" / "base"
    assert run_fetch(hub, tmp_path, BASE_REPO, local).rc == 0
    before = {p: (p.stat().st_mtime_ns, _sha256(p)) for p in local.iterdir() if p.is_file()}
    wrong = "hf_wrong_token_0123456789"
    bad = run_fetch(hub, tmp_path, BASE_REPO, local, token=wrong)
    assert bad.rc == 1
    assert "rejected the token" in bad.result["msg"] and "model_hf_token" in bad.result["msg"]
    assert wrong not in bad.stdout and wrong not in bad.stderr
    assert [e["status"] for e in hub.hub.log[-1:]] == [401]
    none = run_fetch(hub, tmp_path, BASE_REPO, local, token=None)
    assert none.rc == 1
    assert none.result["msg"].startswith(f"{BASE_REPO} is gated: the hub refused access without a token")
    assert "\n" not in none.result["msg"]
    assert {p: (p.stat().st_mtime_ns, _sha256(p)) for p in local.iterdir() if p.is_file()} == before
    # The ungated GGUF repository needs no token; a wrong one is refused there as well.
    assert run_fetch(hub, tmp_path, GGUF_REPO, tmp_path / "g1", token=None).rc == 0
    assert "rejected the token" in run_fetch(hub, tmp_path, GGUF_REPO, tmp_path / "g2", token=wrong).result["msg"]


def test_not_enough_disk_is_refused_before_any_download(hub: Hub, tmp_path: Path) -> None:
    local = tmp_path / "model" / "gguf"
    local.mkdir(parents=True)
    # The free space itself plus 10 GiB: the check must refuse even if other work frees
    # space on the disk between this reading and the fetch's own (a headroom of exactly
    # the free space failed once in CI when a container was removed meanwhile).
    headroom = shutil.disk_usage(local).free + 10 * 1024**3
    got = run_fetch(hub, tmp_path, GGUF_REPO, local, headroom=headroom)
    assert got.rc == 1
    assert "headroom" in got.result["msg"] and "nothing downloaded" in got.result["msg"]
    assert not hub.requests(prefix=f"/{GGUF_REPO}/resolve/") and not hub.requests(prefix="/_blobs/")
    assert [p.name for p in local.iterdir()] == []


def test_unknown_repo_and_revision_fail_with_one_line(hub: Hub, tmp_path: Path) -> None:
    got = run_fetch(hub, tmp_path, "unsloth/GLM-5-GGUF-missing", tmp_path / "x")
    assert got.rc == 1 and got.result["msg"].endswith("repository not found, or not visible with this token")
    assert TOKEN not in got.stdout


def test_verify_detects_a_corrupted_file_afterwards(hub: Hub, tmp_path: Path) -> None:
    gguf, base = tmp_path / "model" / "gguf", tmp_path / "model" / "base"
    assert run_fetch(hub, tmp_path, GGUF_REPO, gguf).rc == 0
    assert run_fetch(hub, tmp_path, BASE_REPO, base).rc == 0
    for local in (gguf, base):
        ok = _verify(local)
        assert not ok["failed"], ok["out"]
    shard = sorted(gguf.rglob("*.gguf"))[-1]
    with shard.open("r+b") as fh:  # same size, one byte flipped
        fh.seek(shard.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    bad = _verify(gguf)
    assert bad["failed"] and f"{shard}: sha256" in bad["out"]
    config = base / "config.json"
    config.write_text(config.read_text().replace("{", "[", 1))  # a small (git) file
    bad = _verify(base)
    assert bad["failed"] and "config.json: sha256" in bad["out"]


def test_a_second_fetch_waits_for_the_first_then_finds_its_files(hub: Hub, tmp_path: Path) -> None:
    """One fetch at a time per directory (--lock): a rerun while the fetch of a killed run
    still goes on waits for it instead of writing the same files beside it. The first one's
    progress document says how far it is while the second waits; its token came from a
    file that it removed once read."""
    hub.hub.blob_seconds = 4.0
    local, state = tmp_path / "model" / "gguf", tmp_path / "state"
    state.mkdir()
    token_file = state / "hf-token"
    token_file.write_text(TOKEN)
    lock, progress = state / "fetch.lock", state / "fetch.json"
    common = ["--lock", str(lock), "--progress", str(progress), "--interval", "0.5"]
    cmd, env = fetch_command(hub, tmp_path, GGUF_REPO, local, token=None,
                             extra=[*common, "--token-file", str(token_file)])
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.1)
        assert lock.read_text().strip() == str(first.pid)
        assert not token_file.exists(), "the token file stays on the disk"
        second = run_fetch(hub, tmp_path, GGUF_REPO, local, extra=common)
        assert first.wait(60) == 0
    finally:
        first.kill()
    assert json.loads(first.stdout.read() if first.stdout else "{}")["downloaded"] == 2
    assert second.rc == 0 and second.result["downloaded"] == 0 and second.result["changed"] is False
    assert len(hub.requests("GET", "/_blobs/")) == 2, "each shard is downloaded once"
    doc = json.loads(progress.read_text())
    assert doc["done"] is True and doc["files_done"] == doc["files_total"] == 2
    assert doc["bytes_done"] == doc["bytes_total"] and doc.get("nothing_to_do") is True


def test_progress_document_while_a_shard_comes_in(hub: Hub, tmp_path: Path) -> None:
    hub.hub.blob_seconds = 6.0
    local, progress = tmp_path / "model" / "gguf", tmp_path / "fetch.json"
    cmd, env = fetch_command(hub, tmp_path, GGUF_REPO, local, extra=["--progress", str(progress), "--interval", "0.3"])
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    seen: list[dict] = []
    try:
        while run.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                seen.append(json.loads(progress.read_text()))
            time.sleep(0.3)
    finally:
        run.kill()
    assert run.returncode == 0
    moving = [d for d in seen if 0 < d.get("bytes_done", 0) < d.get("bytes_total", 0)]
    assert moving, seen[-3:]
    mid = moving[len(moving) // 2]
    assert mid["what"] == GGUF_REPO and mid["files_total"] == 2 and mid["current"]
    assert mid["current"][0]["path"].startswith(f"{QUANT}/") and mid["current"][0]["bytes"] > 0
    assert mid["rate"] > 0 and mid["resumed_bytes"] == 0
    assert [d["bytes_done"] for d in moving] == sorted(d["bytes_done"] for d in moving)
