"""Action plugin: the digest of everything on the controller that a run of site.yml reads.

The no-op shortcut of site.yml (playbooks/unchanged.yml, docs/noop-shortcut.md) skips a host
whose inputs and host state equal those recorded after its last full run. This plugin
computes the inputs half, on the controller, without contacting the host:

- every variable of the host as the run sees it (inventory, group and host vars, extra
  vars, role glm5's defaults), templated, except gathered facts, what this run
  registered or set on the host (observations of the host: the host state covers them)
  and Ansible's own per-run names (``SKIPPED_NAMES``); a value that cannot be templated
  here is taken as written;
- the content of every file of the project that a run reads (``PROJECT_PARTS``: roles,
  playbooks, files, src, requirements, site.yml, ansible.cfg) and the installed
  collections' manifests;
- the content of the controller files and trees the settings in CONTROLLER_PATH_SETTINGS
  name (a lock file, a patch set, a source tree);
- ansible-core's and Python's versions.

It also says whether this run may use the shortcut at all (``eligible``): not in a run
limited by tags, skip tags, --start-at-task or --step, not when glm5_noop_shortcut is
off. It changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.release import __version__ as ANSIBLE_VERSION

PROJECT = Path(__file__).resolve().parents[3]
PROJECT_PARTS = ("site.yml", "ansible.cfg", "requirements.yml", "roles", "playbooks", "files", "src", "requirements")
SKIPPED_DIRS = {"__pycache__", ".git", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# Ansible's own names for this run, the switch and the record's place (neither changes the
# deployment), and the play's mode: not inputs. What the run sets on the host: _runtime_names.
SKIPPED_NAMES = frozenset(
    {
        "ansible_check_mode", "ansible_diff_mode", "ansible_current_hosts", "ansible_failed_hosts",
        "ansible_forks", "ansible_verbosity",
        "ansible_run_tags", "ansible_skip_tags", "ansible_limit", "ansible_inventory_sources",
        "ansible_playbook_python", "ansible_search_path", "ansible_version", "ansible_config_file",
        "ansible_play_hosts", "ansible_play_hosts_all", "ansible_play_batch", "ansible_play_name",
        "ansible_play_role_names", "ansible_role_names", "ansible_dependent_role_names",
        "ansible_collection_name", "ansible_parent_role_names", "ansible_parent_role_paths",
        "ansible_role_name", "ansible_loop_var", "ansible_index_var", "ansible_loop",
        "ansible_facts", "ansible_local", "module_setup", "gather_subset", "discovered_interpreter_python",
        "ansible_python_interpreter_discovered",
        "play_hosts", "role_names", "role_name", "role_path", "role_uuid", "playbook_dir",
        "inventory_dir", "inventory_file", "hostvars", "groups", "vars", "environment", "omit",
        "glm5_noop_shortcut", "glm5_host_state_record", "glm5_host_state_mode",
    }
)
# Paths named by settings that are not host state of the deployment: caches, temporary
# and runtime directories, logs (the service and the system write there all the time).
VOLATILE_PREFIXES = ("/var/cache/", "/tmp/", "/var/tmp/", "/run/", "/proc/", "/sys/", "/dev/", "/var/log/")
# Settings naming one of these whole directories add it alone, not its tree.
TOP_DIRECTORIES = frozenset({"/", "/usr", "/var", "/var/lib", "/lib", "/home", "/root", "/mnt", "/media", "/data"})
FILE_LIMIT = 256 << 20  # larger controller files: size and mtime, not content
# Settings that name a file or directory on the controller (their roles' argument_specs say
# "on the controller"; devtests/unit/test_run_inputs.py keeps the two in step): their
# content is an input. Every other absolute path a setting names is on the host.
CONTROLLER_PATH_SETTINGS = (
    "cuda_toolkit_lock_file",
    "flash_attn_source_dir",
    "ml_env_lock_file",
    "offline_bundle_lock_file",
    "vllm_patches_source_dir",
    "vllm_router_lock_file",
)


def _hash_file(digest: Any, path: Path) -> None:
    st = path.stat()
    if st.st_size > FILE_LIMIT:
        digest.update(f"size {st.st_size} mtime {st.st_mtime_ns}\n".encode())
        return
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    digest.update(b"\n")


def _hash_path(digest: Any, top: Path) -> None:
    """A file's content, or each file's name (relative to top) and content in a tree (no caches)."""
    if top.is_file():
        _hash_file(digest, top)
        return
    for directory, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                path = Path(directory, name)
                digest.update(str(path.relative_to(top)).encode() + b"\0")
                _hash_file(digest, path)


def project_digest(root: Path = PROJECT) -> str:
    """sha256 over the content of every file of the project a run reads."""
    digest = hashlib.sha256()
    for part in PROJECT_PARTS:
        digest.update(f"{part}\0".encode())
        _hash_path(digest, root / part)
    return digest.hexdigest()


def collections_digest() -> str:
    """sha256 over the MANIFEST.json of every installed collection (name, version, files' checksums)."""
    digest = hashlib.sha256()
    for base in C.COLLECTIONS_PATHS:
        top = Path(base, "ansible_collections")
        for manifest in sorted(top.glob("*/*/MANIFEST.json")) if top.is_dir() else []:
            digest.update(f"{manifest.relative_to(top)}\0".encode())
            _hash_file(digest, manifest)
    return digest.hexdigest()


def _paths_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith("/") and "\n" not in value and len(value) < 4096 else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths_in(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _paths_in(v)]
    return []


def controller_files_digest(values: dict[str, Any]) -> str:
    """sha256 over the content of the controller files and trees that CONTROLLER_PATH_SETTINGS name."""
    digest = hashlib.sha256()
    for setting in CONTROLLER_PATH_SETTINGS:
        value = values.get(setting)
        if not isinstance(value, str) or not value:
            continue
        path = Path(value)
        digest.update(f"{setting}\0{value}\0".encode())
        try:
            if path.exists():
                _hash_path(digest, path)
            else:
                digest.update(b"missing\n")
        except OSError:
            digest.update(b"unreadable\n")
    return digest.hexdigest()


def host_roots(values: dict[str, Any]) -> list[Any]:
    """Roots of the host state for every absolute path a setting names (glm5_host_state)."""
    roots: list[Any] = []
    named = {
        os.path.normpath(p)
        for name, value in values.items()
        if name not in CONTROLLER_PATH_SETTINGS and not name.startswith("glm5_host_state_")
        for p in _paths_in(value)
    }
    for name in sorted(named):
        if (name + "/").startswith(VOLATILE_PREFIXES) or any(c in name for c in "{}*?["):
            continue
        roots.append({"path": name, "depth": 0} if name in TOP_DIRECTORIES else name)
    return roots


# Keys of a registered module result (the validation phase's observations of the host)
# that change with every run: when and how long, not what was observed.
RESULT_CLOCK_KEYS = frozenset({"start", "end", "delta", "elapsed", "date", "atime"})


def plain(value: Any, in_result: bool = False) -> Any:
    """JSON-ready copy of a templated value (registered results without their clock keys)."""
    if isinstance(value, dict):
        in_result = in_result or ("changed" in value and "failed" in value)
        return {
            str(k): plain(v, in_result)
            for k, v in value.items()
            if not (in_result and str(k) in RESULT_CLOCK_KEYS)
        }
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v, in_result) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return to_text(value)


def ineligible_reasons(task_vars: dict[str, Any], enabled: bool) -> list[str]:
    """Why this run may not skip a host (empty: it may)."""
    reasons = []
    if not enabled:
        reasons.append("glm5_noop_shortcut is off")
    if list(task_vars.get("ansible_run_tags", ["all"])) != ["all"]:
        reasons.append("the run is limited by --tags")
    if list(task_vars.get("ansible_skip_tags", [])):
        reasons.append("the run skips tags (--skip-tags)")
    if context.CLIARGS.get("start_at_task"):
        reasons.append("the run starts at a task (--start-at-task)")
    if context.CLIARGS.get("step"):
        reasons.append("the run is stepped (--step)")
    return reasons


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible-core ships no type stubs
    """glm5_run_inputs: digest of the run's inputs; whether the shortcut may be used."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def _runtime_names(self, host: str) -> set[str]:
        """Names this run registered or set (set_fact) on the host so far: observations of the
        host and what was derived from them and the settings, not inputs. The host's state
        is probed as such, and an observation of it taken before this run's changes would
        never match the state recorded after them."""
        manager = self._task.get_variable_manager()
        cache = getattr(manager, "_nonpersistent_fact_cache", None)
        if not isinstance(cache, dict):
            raise AnsibleError("glm5_run_inputs: this ansible-core keeps no per-host cache of registered values")
        return set(cache.get(host, {}))

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = dict(super().run(tmp, task_vars))
        task_vars = task_vars or {}
        enabled = boolean(self._templar.template(self._task.args.get("enabled", True)), strict=False)
        facts = task_vars.get("ansible_facts", {}) or {}
        injected = {f"ansible_{name}" for name in facts}
        runtime = self._runtime_names(str(task_vars.get("inventory_hostname", "")))
        values: dict[str, Any] = {}
        for name in sorted(task_vars):
            if name in SKIPPED_NAMES or name in injected or name in runtime or name.startswith("ansible_parent_role"):
                continue
            raw = task_vars[name]
            try:
                values[name] = plain(self._templar.template(raw))
            except AnsibleError:
                values[name] = plain(raw)
        dump = os.environ.get("GLM5_RUN_INPUTS_DUMP")
        if dump:
            # Development aid (docs/noop-shortcut.md): what went into the digest, to find a
            # value that differs between runs. It holds secrets: written mode 0600.
            fd = os.open(dump, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(values, fh, sort_keys=True, indent=1, default=str)
        pieces = {
            "settings": hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest(),
            "project files": project_digest(),
            "collections": collections_digest(),
            "controller files the settings name": controller_files_digest(values),
            "ansible and python": f"{ANSIBLE_VERSION} {sys.version_info[0]}.{sys.version_info[1]}",
        }
        reasons = ineligible_reasons(task_vars, enabled)
        result.update(
            changed=False,
            digest=pieces,
            eligible=not reasons,
            reasons=reasons,
            names=sorted(values),
            roots=host_roots(values),
        )
        return result
