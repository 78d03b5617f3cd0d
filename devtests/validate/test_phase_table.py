"""The phase table (playbooks/vars/phases.yml) and the validation phase's choice of roles
from it (filter glm5_phase_roles, playbooks/filter_plugins/glm5_phases.py): which roles'
checks a run makes, for site.yml and for each phase playbook run alone, under --tags; and
the table is what the phase plays apply, in their order, with its tags."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
TABLE: dict[str, Any] = yaml.safe_load((ROOT / "playbooks/vars/phases.yml").read_text())["glm5_phases"]
GPU = ["nvidia_driver", "cuda_toolkit", "ml_env", "flash_attn", "vllm_patches", "model", "gpu_tuning", "nccl_check",
       "exposure", "tls_proxy", "gpu_exporter", "vllm_service"]


@pytest.fixture(scope="module")
def f() -> ModuleType:
    return load_file(ROOT / "playbooks/filter_plugins/glm5_phases.py")


@pytest.mark.parametrize(
    ("run_tags", "phase", "hosts", "expected"),
    [
        # site.yml (no phase): every role with checks, in the table's order.
        (["all"], "", "gpu_servers", GPU),
        (["validate"], "", "gpu_servers", GPU),
        (["all"], "", "routers", ["vllm_router"]),
        # --tags <phase> or a role's own tag.
        (["service"], "", "gpu_servers", ["vllm_service"]),
        (["service"], "", "routers", ["vllm_router"]),
        (["router"], "", "gpu_servers", []),
        (["nvidia_verify"], "", "gpu_servers", ["nvidia_driver", "cuda_toolkit"]),
        (["cuda_verify"], "", "gpu_servers", ["cuda_toolkit"]),
        (["gpu_tuning", "model"], "", "gpu_servers", ["model", "gpu_tuning"]),
        (["verify"], "", "gpu_servers", ["vllm_service"]),
        (["verify"], "", "routers", []),
        # preflight: no role checks (the project-wide ones only).
        (["preflight"], "", "gpu_servers", []),
        (["preflight", "validate"], "", "gpu_servers", []),
        # A phase playbook run alone: its roles, and those that read its settings.
        (["all"], "production", "gpu_servers", ["gpu_tuning", "nccl_check", "exposure", "tls_proxy", "gpu_exporter"]),
        (["all"], "python_env", "gpu_servers", ["ml_env", "flash_attn"]),
        (["all"], "preflight", "gpu_servers", []),
        (["all"], "service", "routers", ["vllm_router"]),
        (["all"], "verify", "gpu_servers", ["vllm_service"]),
        (["all"], "verify", "routers", []),
        (["nvidia_verify"], "gpu_stack", "gpu_servers", ["nvidia_driver", "cuda_toolkit"]),
        (["exposure"], "production", "gpu_servers", ["exposure"]),
        (["model"], "production", "gpu_servers", []),
    ],
)
def test_the_roles_a_run_validates(f, run_tags, phase, hosts, expected):
    assert f.glm5_phase_roles(TABLE, run_tags, phase, hosts=hosts) == expected


def _applied() -> list[tuple[str, str, Any]]:
    """(role, hosts, tags) of every role the phase plays apply, in site.yml's order."""
    site = yaml.safe_load((ROOT / "site.yml").read_text())
    out = []
    for entry in site:
        path = entry["ansible.builtin.import_playbook"]
        if not path.startswith("playbooks/phases/"):
            continue
        for play in yaml.safe_load((ROOT / path).read_text()):
            for role in play.get("roles", []):
                if role["role"] != "glm5":
                    out.append((role["role"], play["hosts"], play["tags"]))
    return out


def test_the_table_is_what_the_phase_plays_apply_in_order():
    roles = [role for role, _, _ in _applied()]
    # tls_proxy also fronts the router (the router's play applies it after vllm_router).
    assert roles == [*TABLE, "tls_proxy"], roles


def test_each_play_takes_its_tags_and_hosts_from_the_table():
    for role, hosts, tags in _applied():
        if hosts == "routers":
            assert TABLE.get(role, {}).get("hosts", "routers") == "routers" or role == "tls_proxy", role
            continue
        assert hosts == "{{ glm5_phase_hosts }}", role
        # written out (a template there is what --list-tags would print), equal to the row
        assert tags == TABLE[role]["tags"], (role, tags)
    assert [tags for role, _, tags in _applied() if role == "vllm_router"] == [TABLE["vllm_router"]["tags"]]


def test_each_phase_playbook_validates_its_phase_first():
    for phase in {row["tags"][0] for row in TABLE.values()} | {"verify"}:
        entries = yaml.safe_load((ROOT / f"playbooks/{phase}.yml").read_text())
        assert [e["ansible.builtin.import_playbook"] for e in entries] == ["validate.yml", f"phases/{phase}.yml"]
        assert entries[0]["vars"] == {"glm5_validate_phase": phase}


def test_every_role_with_checks_has_them_and_only_those():
    for role, row in TABLE.items():
        assert (ROOT / f"roles/{role}/tasks/validate.yml").exists() == row.get("checks", True), role


def test_the_readme_states_the_runs_plays_and_tasks():
    """README's "N plays and M tasks" is what `ansible-playbook site.yml --list-tasks` lists."""
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "--list-tasks"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    plays = len(re.findall(r"(?m)^  play #\d+", done.stdout))
    tasks = len(re.findall(r"(?m)^      \S.*\tTAGS: ", done.stdout))
    stated = re.search(r"(\d+) plays and (\d+) tasks", (ROOT / "README.md").read_text())
    assert stated and (int(stated.group(1)), int(stated.group(2))) == (plays, tasks), (plays, tasks)


def test_list_tags_shows_every_phase_tag_rendered():
    """`ansible-playbook site.yml --list-tags` is how a user finds the tags: each play's
    are the names themselves, never a template, and every row's tags are among them."""
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "--list-tags"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert "{{" not in done.stdout, done.stdout
    listed = {t.strip() for line in re.findall(r"(?m)^\s+play #\d+ .*\tTAGS: \[(.*)\]$", done.stdout)
              for t in line.split(",")}
    assert {t for row in TABLE.values() for t in row["tags"]} <= listed, listed
