"""Role vllm_patches through ansible-runner against localhost, on copies of the real files.

Wrong version: refused, naming both versions, site-packages byte-identical after.
Right version: applied, second run changed=0, absent restores the pristine files.
Faults, one host's sequence: the module SIGKILLed while it applies the set, then
rerun; a patched file edited, refused without the wheel's files, repaired with them
and named in glm5_integrity_repairs; then nothing to do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sitecopy import INSTALLED, MODULE, PATCH_DIR, ROOT, make_site, originals, pristine, snapshot

ansible_runner = pytest.importorskip("ansible_runner")
pytestmark = pytest.mark.skipif(INSTALLED is None, reason="needs .venv-ml (pinned vLLM)")

PLAY = """---
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: vllm_patches
  post_tasks:
    - name: Show the repairs
      ansible.builtin.debug:
        msg: "repairs={{ glm5_integrity_repairs | default([]) | to_json }}"
"""
KILLHOOK = Path(__file__).resolve().parent / "killhook"


def converge(tmp_path: Path, site: Path, check: bool = False, **extra: Any) -> Any:
    # A fresh private data dir each run: ansible-runner keeps a run's command line
    # (--check) in it for the next one.
    data = Path(tempfile.mkdtemp(prefix="runner", dir=tmp_path))
    (data / "project").mkdir(parents=True, exist_ok=True)
    (data / "project" / "play.yml").write_text(PLAY)
    extravars: dict[str, Any] = {
        "vllm_patches_site_packages": str(site),
        "vllm_patches_python": sys.executable,
        "vllm_patches_dir": str(tmp_path / "patches"),
        "vllm_patches_install_tool": False,
        "ansible_python_interpreter": sys.executable,
    }
    extravars.update(extra)
    return ansible_runner.run(
        private_data_dir=str(data),
        playbook="play.yml",
        inventory="localhost ansible_connection=local",
        extravars=extravars,
        cmdline="--check" if check else None,
        envvars={
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        },
        quiet=True,
    )


def changed(run: Any) -> int:
    return int(run.stats["changed"].get("localhost", 0))


def test_wrong_version_refused_untouched(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site", version="0.20.1")
    before = snapshot(site)
    run = converge(tmp_path, site)
    assert run.rc != 0
    out = run.stdout.read()
    assert "0.20.1" in out and "0.20.2" in out and "Nothing was changed" in out
    assert snapshot(site) == before
    assert not (tmp_path / "patches").exists()


def test_apply_idempotent_absent(tmp_path: Path) -> None:
    site = make_site(tmp_path / "site")
    first = converge(tmp_path, site)
    assert first.rc == 0 and changed(first) > 0 and not pristine(site)
    second = converge(tmp_path, site)
    assert second.rc == 0 and changed(second) == 0
    check = converge(tmp_path, site, check=True)
    assert check.rc == 0 and changed(check) == 0
    gone = converge(tmp_path, site, vllm_patches_state="absent")
    assert gone.rc == 0 and changed(gone) > 0 and pristine(site)
    assert not (site / "vllm" / ".glm5-patchset.json").exists()


def repairs(run: Any) -> list[str]:
    for event in run.events:
        msg = str(event.get("event_data", {}).get("res", {}).get("msg", ""))
        if event["event"] == "runner_on_ok" and msg.startswith("repairs="):
            return list(json.loads(msg[len("repairs="):]))
    raise AssertionError("the play did not show its repairs")


def test_killed_then_edited_through_the_role(tmp_path: Path) -> None:
    """One host's sequence through the role:
    1. the module is SIGKILLed (by the kernel, at the third file it replaces) while it
       applies the set: the run fails, the tree is half-patched, no manifest;
    2. the rerun converges to the tree an uninterrupted run makes (the module alone,
       as reference);
    3. a patched file is edited (a line appended, its mtime put back): with no original
       at hand the run is refused naming the file and the remedy, nothing changed;
    4. check mode with the wheel's files at hand reports the repair and writes nothing;
    5. the run restores the file from the wheel's and patches it again, names it in
       glm5_integrity_repairs (so no no-op record), the manifest as before;
    6. the next run changes nothing and repairs nothing."""
    reference = make_site(tmp_path / "reference")
    args = tmp_path / "reference-args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "site_packages": str(reference), "patch_dir": str(PATCH_DIR), "patchset_version": "0.20.2",
        "python": sys.executable}}))
    subprocess.run([sys.executable, str(MODULE), str(args)], check=True, capture_output=True)

    def files(root: Path) -> dict[str, str]:
        return {k: v for k, v in snapshot(root).items() if "__pycache__" not in k}

    site = make_site(tmp_path / "site")
    mark = tmp_path / "killed"
    python = tmp_path / "python-killed-at-rename-3"
    python.write_text(
        "#!/bin/sh\n"
        f"GLM5_KILL_AT=rename:3 GLM5_KILL_UNDER={site}/ GLM5_KILL_MARK={mark} PYTHONPATH={KILLHOOK} "
        f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    killed = converge(tmp_path, site, ansible_python_interpreter=str(python))
    assert killed.rc != 0 and mark.read_text().startswith("rename 3: "), killed.rc
    assert not pristine(site) and files(site) != files(reference)
    assert not (site / "vllm/.glm5-patchset.json").exists()

    rerun = converge(tmp_path, site)
    assert rerun.rc == 0 and changed(rerun) > 0 and repairs(rerun) == []
    assert files(site) == files(reference)

    rel = "vllm/model_executor/model_loader/gguf_loader.py"
    manifest = (site / "vllm/.glm5-patchset.json").read_bytes()
    st = (site / rel).stat()
    (site / rel).write_bytes((site / rel).read_bytes() + b"print('edited')\n")
    os.utime(site / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = snapshot(site)
    refused = converge(tmp_path, site, vllm_patches_wheel_sources=[str(tmp_path / "no-cache")])
    assert refused.rc != 0
    msg = next(e for e in refused.events if e["event"] == "runner_on_failed")["event_data"]["res"]["msg"]
    assert str(site / rel) in msg and "no source holds the original" in msg and ".glm5-lock.sha256" in msg
    assert snapshot(site) == edited

    sources = [str(originals(tmp_path / "uv-cache"))]
    check = converge(tmp_path, site, check=True, vllm_patches_wheel_sources=sources)
    assert check.rc == 0 and changed(check) > 0 and snapshot(site) == edited

    repaired = converge(tmp_path, site, vllm_patches_wheel_sources=sources)
    assert repaired.rc == 0 and changed(repaired) > 0
    assert repairs(repaired) == [f"vLLM file {rel}"]
    assert files(site) == files(reference) and (site / "vllm/.glm5-patchset.json").read_bytes() == manifest

    again = converge(tmp_path, site, vllm_patches_wheel_sources=sources)
    assert again.rc == 0 and changed(again) == 0 and repairs(again) == []
