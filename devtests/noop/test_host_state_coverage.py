"""The no-op shortcut is only safe if the host state it probes covers
everything the roles of site.yml manage. This test reads every task and handler of those
roles and fails on one the probe would not see change:

- a file-writing module (copy, template, file, lineinfile, ...) whose path, resolved
  through the roles' defaults and vars, is not under a whole-tree root of
  glm5_host_state_roots (or is not resolvable and not listed in UNRESOLVED with why it is
  covered);
- a unit started or stopped by systemd_service that the same task does not enable or
  disable (the probe finds units by their file or enablement link in /etc/systemd/system),
  unless listed in glm5_host_state_units;
- a command or shell task that can report a change, or a module this test does not
  know, not listed in CHANGERS with what part of the probe covers what it changes.

A role that starts managing something new fails here until the probe covers it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# The roles of site.yml: the phase table's (playbooks/vars/phases.yml), and glm5, every
# role's dependency. A role added to the run is scanned here without a change to this file.
ROLES = ("glm5", *yaml.safe_load((ROOT / "playbooks/vars/phases.yml").read_text())["glm5_phases"])
WRITERS = {"copy", "template", "file", "lineinfile", "blockinfile", "get_url", "unarchive", "deb822_repository",
           "openssl_privatekey", "openssl_csr", "x509_certificate"}
READERS = {"set_fact", "assert", "debug", "include_tasks", "import_tasks", "include_role", "import_role", "stat",
           "slurp", "uri", "fail", "meta", "validate_argument_spec", "setup", "include_vars", "find", "wait_for",
           "package_facts", "pause", "async_status", "getent", "fetch", "service_facts", "x509_certificate_info",
           "glm5_tree_state", "glm5_model_layout", "glm5_host_probe", "glm5_offline_bundle", "glm5_run_inputs",
           "glm5_model_verify", "glm5_dpkg_lock", "glm5_warn", "script", "glm5_job_progress", "glm5_unit_wait"}
# Paths that cannot be resolved from defaults (loop items, registered results) and why
# the probe covers them: "<role>: <task name>" -> reason.
UNRESOLVED = {
    "nvidia_driver: Remove the conflicting sources": "files found under /etc/apt/sources.list.d (/etc)",
    "ml_env: Remove venvs beyond ml_env_keep and half-built ones (never the current one)": "venvs found under "
    "ml_env_root (/opt by default; another value is a setting, hence a root of its own)",
    "ml_env: Copy the lock into the venv": "a file in a venv under ml_env_root (as above)",
    "ml_env: Mark the venv complete": "a file in a venv under ml_env_root (as above)",
    "flash_attn: Create the build and wheel folders": "flash_attn_build_dir (/var/lib/glm5) and a folder under "
    "flash_attn_wheel_cache_dir (/var/cache: a cache)",
    "flash_attn: Write the build stamp (version, archs, torch)": "a file in the ml-env venv (as above)",
    "vllm_service: Record the last good unit, the one before it as <unit>.previous": "copies beside the unit "
    "file, in vllm_service_unit_dir (/etc/systemd/system)",
    "vllm_service: Remove the units of an earlier served name and their records": "units in /etc/systemd/system"
    " and their records in vllm_service_config_dir (/etc/glm5)",
}
# Caches: a full run that needs one makes it again; nothing the service runs or reads is
# in it (what is installed from it is under /opt). Not host state of the deployment.
CACHES = ("/var/cache/",)
# Tasks that change the host other than by a file module, and what part of the probe
# sees the change: "<role>: <task name>" -> reason.
CHANGERS = {
    "nvidia_driver: Rebuild the initramfs": "files:/boot (a new initrd image)",
    "ml_env: Give them to root and take the group's and others' write bits off": "files under the venv root (/opt)",
    "ml_env: Create the venv": "files:/opt (the venv root)",
    "ml_env: Remove a partly built venv (once an install left running there has ended)": "files:/opt (a venv "
    "under ml_env_root, and its build lock file beside it)",
    "ml_env: Install the locked packages (uv pip sync, hashes required), in the background": "files:/opt (the venv "
    "root)",
    "ml_env: Install uv, pinned, into its tool venv": "files:/opt (ml_env_uv_venv)",
    "flash_attn: Install pip into the venv (pip wheel builds the wheel)": "files:/opt (the venv)",
    "flash_attn: Start the build in the background": "writes only its build directory (/var/lib/glm5)",
    "flash_attn: Record the build": "files:/var/lib/glm5 (the build record)",
    "flash_attn: Install the wheel into the venv": "files:/opt (the venv)",
    "vllm_patches: Apply, verify and repair, or reverse the patch set (all or nothing)": "files:/opt (the venv's "
    "vLLM)",
    "model: Fetch the repository in the background (huggingface_hub, resumable)": "files:/srv (glm5_model_dir; "
    "another value is a setting, hence a root of its own)",
    "model: Copy the model files from the local directory (in the background)": "files:/srv (glm5_model_dir; "
    "another value is a setting, hence a root of its own)",
    "model: Find what to copy from the local directory": "reads only (plan_only: true)",
    "gpu_tuning: Update GRUB for gpu_tuning": "files:/boot (grub/ is replaced by update-grub)",
    "vllm_service: Parse the ExecStart arguments with the installed vLLM's parser": "reads only; its stamp file is "
    "a copy task under /etc",
    "vllm_router: Install uv, pinned, into its tool venv": "files:/opt (vllm_router_uv_venv)",
    "vllm_router: Create the venv": "files:/opt (vllm_router_root)",
    "vllm_router: Install the locked packages (uv pip sync, hashes required)": "files:/opt (vllm_router_root)",
    "vllm_router: Take the others' write bit off the venv (uv makes its .lock 0666)": "files:/opt",
    "glm5: Compare the host's state with its record (probe), or write the record after a full run (record)":
    "the record itself, outside the roots",
}
APT = {"apt", "dpkg_selections", "apt_key"}  # covered by files:/var/lib/dpkg/status and /etc/apt
REBOOT = {"reboot"}  # covered by the boot part (boot id)
ACCOUNTS = {"user", "group"}  # covered by files:/etc (passwd, group, shadow)


def _tasks(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, list):
        for item in node:
            out += _tasks(item)
    elif isinstance(node, dict):
        if "block" in node:
            for key in ("block", "rescue", "always"):
                out += _tasks(node.get(key, []))
        else:
            out.append(node)
    return out


def _module(task: dict[str, Any]) -> str | None:
    for key in task:
        if key.startswith(("ansible.", "community.", "glm5_")):
            return key
    return None


def _defaults() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for role in ROLES:
        for sub in ("defaults", "vars"):
            base = ROOT / "roles" / role / sub
            files = sorted(base.glob("main/*.yml")) + ([base / "main.yml"] if (base / "main.yml").exists() else [])
            for f in files:
                values.update(yaml.safe_load(f.read_text()) or {})
    return values


VALUES = _defaults()
REF = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*(\|\s*dirname\s*)?\}\}")


def resolve(raw: str, depth: int = 0) -> str:
    """raw with each plain {{ name }} (or {{ name | dirname }}) replaced by its default, as far as that goes."""
    def one(match: re.Match[str]) -> str:
        value = VALUES.get(match.group(1))
        if not isinstance(value, str) or depth >= 8:
            return match.group(0)
        value = resolve(value, depth + 1)
        return value.rsplit("/", 1)[0] if match.group(2) else value

    return REF.sub(one, raw)


def _tree_roots() -> list[str]:
    roots = yaml.safe_load((ROOT / "roles/glm5/defaults/main/site.yml").read_text())["glm5_host_state_roots"]
    return [r for r in roots if isinstance(r, str)]


def covered(path: str, roots: list[str]) -> bool:
    if path.startswith(CACHES):
        return True
    prefix = path.split("{{")[0]
    if not prefix.startswith("/"):
        return False
    if "{{" in path:
        prefix = prefix.rsplit("/", 1)[0] + "/"
    return any(prefix.rstrip("/") == r or prefix.startswith(r + "/") for r in roots)


def _role_tasks() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for role in ROLES:
        for sub in ("tasks", "handlers"):
            for f in sorted((ROOT / "roles" / role / sub).glob("*.yml")):
                found += [(role, t) for t in _tasks(yaml.safe_load(f.read_text()) or [])]
    return found


def test_the_scan_finds_the_roles_tasks():
    names = {f"{role}: {t.get('name')}" for role, t in _role_tasks()}
    assert len(names) > 300
    assert set(UNRESOLVED) | set(CHANGERS) <= names, sorted((set(UNRESOLVED) | set(CHANGERS)) - names)


def test_every_path_a_role_writes_is_under_a_root():
    roots = _tree_roots()
    outside = []
    for role, task in _role_tasks():
        module = _module(task)
        if module is None or module.rsplit(".", 1)[-1] not in WRITERS:
            continue
        args = task[module] if isinstance(task[module], dict) else {}
        raw = str(args.get("dest") or args.get("path") or "")
        if module.endswith("deb822_repository"):
            raw = "/etc/apt/sources.list.d/{{ name }}.sources"  # where the module writes
        key = f"{role}: {task.get('name')}"
        if key in UNRESOLVED:
            continue
        if raw == "{{ item }}" and isinstance(task.get("loop"), list):
            paths = [resolve(str(item)) for item in task["loop"]]
        else:
            paths = [resolve(raw)]
        outside += [f"{key}: {raw} -> {p}" for p in paths if not covered(p, roots)]
    assert outside == []


def test_every_unit_a_role_starts_is_found_by_the_probe():
    extra = yaml.safe_load((ROOT / "roles/glm5/defaults/main/site.yml").read_text())["glm5_host_state_units"]
    missing = []
    for role, task in _role_tasks():
        module = _module(task)
        if module is None or not module.endswith("systemd_service"):
            continue
        args = task[module]
        if "state" in args and "enabled" not in args and args.get("state") not in ("restarted", "reloaded"):
            name = resolve(str(args.get("name")))
            if name not in extra:
                missing.append(f"{role}: {task.get('name')}: {name} {args.get('state')}")
    assert missing == []


@pytest.mark.parametrize("role", ROLES)
def test_every_other_change_is_covered(role):
    unknown = []
    for r, task in _role_tasks():
        if r != role:
            continue
        module = _module(task)
        if module is None:
            continue
        short = module.rsplit(".", 1)[-1]
        key = f"{role}: {task.get('name')}"
        if short in WRITERS | READERS | APT | REBOOT | ACCOUNTS or short == "systemd_service":
            continue
        if short in ("command", "shell") and str(task.get("changed_when", "")).lower() == "false":
            continue
        if key not in CHANGERS:
            unknown.append(f"{key} ({module})")
    assert unknown == []
