"""The no-op shortcut: action plugin glm5_run_inputs digests what a run
reads on the controller. A change of any project file, of a controller file a setting
names, or of a setting's value changes the digest; the clock keys of the validation
phase's registered results do not; a run limited by tags, skip tags, --start-at-task or
--step never takes the shortcut; the list of controller path settings is the one the
roles' argument_specs describe."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from ansible import context

ROOT = Path(__file__).resolve().parents[2]
# The roles site.yml applies (bench and offline_bundle have playbooks of their own).
SITE_ROLES = ("nvidia_driver", "cuda_toolkit", "ml_env", "flash_attn", "vllm_patches", "model", "gpu_tuning",
              "nccl_check", "exposure", "tls_proxy", "gpu_exporter", "vllm_service", "vllm_router", "preflight")


def test_project_digest_changes_with_any_project_file(ri, tmp_path):
    copy = tmp_path / "project"
    for part in ri.PROJECT_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (copy / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / part)
    before = ri.project_digest(copy)
    assert ri.project_digest(copy) == before
    (copy / "roles/vllm_service/templates/vllm.service.j2").write_text("changed")
    assert ri.project_digest(copy) != before
    after = ri.project_digest(copy)
    (copy / "roles/glm5/__pycache__").mkdir(exist_ok=True)
    (copy / "roles/glm5/__pycache__/x.pyc").write_bytes(b"\0")
    assert ri.project_digest(copy) == after  # byte-code caches are not inputs
    (copy / "files/patches/new.patch").write_text("")
    assert ri.project_digest(copy) != after


def test_controller_files_are_read_for_the_controller_settings_only(ri, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("vllm==0.20.2\n")
    tree = tmp_path / "src"
    (tree / "csrc").mkdir(parents=True)
    (tree / "csrc" / "a.cu").write_text("x")
    values = {"ml_env_lock_file": str(lock), "flash_attn_source_dir": str(tree), "glm5_model_dir": str(tmp_path)}
    before = ri.controller_files_digest(values)
    lock.write_text("vllm==0.20.3\n")
    assert ri.controller_files_digest(values) != before
    changed = ri.controller_files_digest(values)
    (tree / "csrc" / "a.cu").write_text("y")
    assert ri.controller_files_digest(values) != changed
    changed = ri.controller_files_digest(values)
    (tmp_path / "unrelated").write_text("")  # glm5_model_dir is a host path: not read here
    assert ri.controller_files_digest(values) == changed


def test_controller_path_settings_are_those_the_argument_specs_describe(ri):
    described = set()
    for role in SITE_ROLES:
        specs = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]
        for spec in specs.values():
            for name, option in (spec.get("options") or {}).items():
                text = option.get("description", "")
                text = " ".join(text) if isinstance(text, list) else str(text)
                if "on the controller" in text or "controller path" in text:
                    described.add(name)
    assert described <= set(ri.CONTROLLER_PATH_SETTINGS)
    assert described, "no controller path setting found: the descriptions changed"


def test_host_roots_from_settings(ri):
    values = {
        "glm5_model_dir": "/data/models/glm-5",
        "ml_env_uv_cache_dir": "/var/cache/glm5/uv",
        "exposure_allowed_sources": ["10.0.0.0/8"],
        "ml_env_lock_file": "/home/me/lock.txt",
        "glm5_host_state_roots": ["/etc"],
        "x_dir": "/var",
        "y": {"nested": ["/srv/extra/"]},
    }
    assert ri.host_roots(values) == ["/data/models/glm-5", "/srv/extra", {"path": "/var", "depth": 0}]


def test_clock_keys_of_registered_results_are_not_inputs(ri):
    result = {"changed": False, "failed": False, "rc": 0, "stdout": "x", "start": "t1", "end": "t2", "delta": "d",
              "stat": {"exists": True, "atime": 1.0, "mtime": 2.0}}
    later = {**result, "start": "t3", "end": "t4", "delta": "e", "stat": {"exists": True, "atime": 9.0, "mtime": 2.0}}
    assert ri.plain(result) == ri.plain(later)
    assert ri.plain({**later, "stdout": "y"}) != ri.plain(result)
    assert ri.plain({**later, "stat": {"exists": True, "atime": 1.0, "mtime": 3.0}}) != ri.plain(result)
    # A setting (not a module result) keeps a key named like a clock key.
    assert ri.plain({"start": 1}) != ri.plain({"start": 2})


@pytest.mark.parametrize(
    ("task_vars", "cli", "enabled", "reason"),
    [
        ({}, {}, False, "glm5_noop_shortcut is off"),
        ({"ansible_run_tags": ["service"]}, {}, True, "the run is limited by --tags"),
        ({"ansible_skip_tags": ["verify"]}, {}, True, "the run skips tags (--skip-tags)"),
        ({}, {"start_at_task": "Write the unit"}, True, "the run starts at a task (--start-at-task)"),
        ({}, {"step": True}, True, "the run is stepped (--step)"),
    ],
)
def test_runs_that_may_not_take_the_shortcut(ri, monkeypatch, task_vars, cli, enabled, reason):
    monkeypatch.setattr(context, "CLIARGS", cli)
    assert ri.ineligible_reasons(task_vars, enabled) == [reason]


def test_a_plain_run_may(ri, monkeypatch):
    monkeypatch.setattr(context, "CLIARGS", {"start_at_task": None, "step": False})
    assert ri.ineligible_reasons({"ansible_run_tags": ["all"], "ansible_skip_tags": []}, True) == []


def test_every_phase_play_of_site_yml_leaves_the_unchanged_hosts_out():
    """Every play of a phase that site.yml runs on the GPU servers, and the record, target
    the phase table's glm5_phase_hosts: the GPU servers less group glm5_unchanged, which
    playbooks/unchanged.yml makes (by construction: no play can forget a pre-task)."""
    site = yaml.safe_load((ROOT / "site.yml").read_text())
    imports = [entry["ansible.builtin.import_playbook"] for entry in site]
    assert imports[:2] == ["playbooks/validate.yml", "playbooks/unchanged.yml"]
    assert imports[-1] == "playbooks/record.yml"
    unchanged = yaml.safe_load((ROOT / "playbooks/unchanged.yml").read_text())[0]["tasks"]
    assert {"key": "glm5_unchanged"} in [t.get("ansible.builtin.group_by") for t in unchanged]
    table = yaml.safe_load((ROOT / "playbooks/vars/phases.yml").read_text())
    assert "groups.glm5_unchanged" in table["glm5_phase_hosts"]
    checked = 0
    for path in imports[2:]:
        for play in yaml.safe_load((ROOT / path).read_text()):
            if play.get("hosts") == "routers":
                continue
            assert play["hosts"] == "{{ glm5_phase_hosts }}", (path, play["name"])
            assert play.get("gather_facts") is False, (path, play["name"])
            checked += 1
    assert checked >= 13
