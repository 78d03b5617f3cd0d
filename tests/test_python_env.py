"""Post-deploy checks of the python_env phase (roles ml_env and flash_attn).

Paths follow the roles' defaults; override with GLM5_ML_ENV_PATH, GLM5_ML_ENV_ROOT,
GLM5_UV_VENV, GLM5_FLASH_ATTN_BUILD_DIR when the inventory changed them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

ML_ENV = os.environ.get("GLM5_ML_ENV_PATH", "/opt/ml-env")
ML_ENV_ROOT = os.environ.get("GLM5_ML_ENV_ROOT", "/opt/ml-envs")
UV_VENV = os.environ.get("GLM5_UV_VENV", "/opt/glm5-uv")
FA_BUILD_DIR = os.environ.get("GLM5_FLASH_ATTN_BUILD_DIR", "/var/lib/glm5/flash-attn-build")
STAMP = f"{ML_ENV}/glm5-flash-attn.json"


def _verify(host, *extra: str) -> dict:
    cmd = host.run(f"{ML_ENV}/bin/python {UV_VENV}/ml_env_verify.py {ML_ENV}/glm5-lock.txt {' '.join(extra)}")
    assert cmd.stdout, cmd.stderr
    return json.loads(cmd.stdout.strip().splitlines()[-1])


def _pins(host) -> dict[str, str]:
    text = host.file(f"{ML_ENV}/glm5-lock.txt").content_string
    return {
        re.sub(r"[-_.]+", "-", m.group(1)).lower(): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)", text, re.M)
    }


def test_venv_path_is_symlink_to_versioned_venv(host):
    link = host.file(ML_ENV)
    assert link.is_symlink
    target = link.linked_to
    assert re.fullmatch(re.escape(ML_ENV_ROOT) + r"/ml-env-[0-9a-f]{12}", target), target
    lock = host.file(f"{target}/glm5-lock.txt").content
    digest = hashlib.sha256(lock).hexdigest()
    assert target.endswith(digest[:12])
    assert host.file(f"{target}/.glm5-lock.sha256").content_string.strip() == digest


def test_kept_venvs_at_most_two(host):
    listed = host.run(f"ls -d {ML_ENV_ROOT}/ml-env-* 2>/dev/null").stdout.split()
    assert 1 <= len(listed) <= 2, listed


# What root runs and imports (docs/production.md, "What root runs"): the venvs (every
# version: a rollback runs the previous one), uv's tool venv, the shipped glm5_tools and
# helper scripts, flash_attn's build tree.
ROOT_RUN_PATHS = (ML_ENV_ROOT, UV_VENV, "/opt/glm5-tools", "/usr/local/lib/glm5-tools",
                  "/usr/local/libexec/glm5", FA_BUILD_DIR)
SERVICE_USER = os.environ.get("GLM5_SERVICE_USER", "vllm")


def writable_by(host, user: str, paths: tuple[str, ...] = ROOT_RUN_PATHS) -> list[str]:
    """What ``user`` may write under ``paths`` (find -writable asks the kernel, as that user)."""
    present = [p for p in paths if host.file(p).exists]
    if not present:
        return []
    cmd = host.run(f"runuser -u {user} -- find {' '.join(present)} -xdev -writable -print")
    denied = [ln for ln in cmd.stderr.splitlines() if ln and "Permission denied" not in ln]
    assert not denied, cmd.stderr
    return cmd.stdout.split()


def test_venv_owned_by_root(host):
    """Root owns the venv (failing first: the role handed the venv to the service account)."""
    target = host.file(ML_ENV).linked_to
    # bin/python is a symlink to the system interpreter (root's): check real venv files.
    for path in (f"{target}/pyvenv.cfg", f"{target}/lib", f"{target}/bin"):
        assert (host.file(path).user, host.file(path).group) == ("root", "root"), path


def test_service_user_cannot_write_what_root_runs(host):
    """Root runs the venv's python (argcheck, nccl_check, diagnostics, the
    patch module, flash_attn's build) and the shipped tools, so the service account must
    not be able to write any file or directory of them (site-packages, .pth files, bin/,
    the patched vLLM files). Without the service account on the host (a python_env-only
    converge) the check runs as nobody, which still finds what others may write.
    devtests/runner/test_venv_ownership.py shows it failing on a wrong layout."""
    user = SERVICE_USER if host.user(SERVICE_USER).exists else "nobody"
    assert writable_by(host, user) == []


def test_no_world_writable_file_in_venv(host):
    """Failing first: uv creates its `.lock` in the venv with mode 0666
    (found on a converged host), so any local user could write into the service's venv
    directory's files. Nothing under the venv (the versioned directory behind the link,
    symlinks aside) may be writable by others. Failed on a venv built by the old role
    (`.lock` listed), passes since ml_env takes the bit off."""
    target = host.file(ML_ENV).linked_to or ML_ENV
    cmd = host.run(f"find {target}/ -xdev -perm -0002 ! -type l -print")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.split() == [], f"world-writable under {target}: {cmd.stdout.split()}"


def test_installed_versions_equal_lock_and_imports_work(host):
    report = _verify(host, "--imports")
    assert report["mismatches"] == {}, report["mismatches"]
    assert report["ok"] is True, report
    pins = _pins(host)
    assert report["versions"]["vllm"] == pins["vllm"] == "0.20.2"
    assert report["versions"]["torch"] == pins["torch"]
    assert report["versions"]["gguf"] == pins["gguf"]
    assert report["imported"]["vllm"] == pins["vllm"]
    assert report["imported"]["torch"].startswith(pins["torch"])
    assert not any(v.startswith("ERROR") for v in report["imported"].values()), report["imported"]


def test_uv_pip_check_clean(host):
    cmd = host.run(f"{UV_VENV}/bin/uv pip check --python {ML_ENV}/bin/python")
    assert cmd.rc == 0, cmd.stdout + cmd.stderr


def test_uv_is_pinned_tool(host):
    cmd = host.run(f"{UV_VENV}/bin/uv --version")
    assert cmd.rc == 0
    assert re.match(r"uv \d+\.\d+\.\d+", cmd.stdout)


def test_torch_sees_gpus_where_there_are_gpus(host):
    if not host.exists("nvidia-smi"):
        pytest.skip("no NVIDIA driver on this host (test container): torch GPU check is GPU-only")
    count = host.run("nvidia-smi -L | wc -l").stdout.strip()
    report = _verify(host, "--imports", "--min-gpus", count)
    assert report["ok"], report


def _stamp(host) -> dict:
    stamp = host.file(STAMP)
    if not stamp.exists:
        pytest.skip("flash-attn not installed by the role (flash_attn_enabled: false)")
    return json.loads(stamp.content_string)


def test_flash_attn_matches_stamp_and_wheel_cached(host):
    stamp = _stamp(host)
    installed = host.run(f"{ML_ENV}/bin/python -c \"import importlib.metadata as m; print(m.version('flash-attn'))\"")
    assert installed.stdout.strip() == stamp["version"]
    assert stamp["torch"] == _pins(host)["torch"]
    assert host.file(stamp["wheel"]).exists, stamp
    assert re.search(r"/flash_attn-" + re.escape(stamp["version"]) + r"-.*\.whl$", stamp["wheel"])
    nproc = int(host.run("nproc").stdout.strip())
    assert 1 <= int(stamp["max_jobs"]) <= nproc


def _standin_record(host) -> dict:
    site = _verify(host)["site_packages"]
    record = host.file(f"{site}/flash_attn/build_record.json")
    if not record.exists:
        pytest.skip("real flash-attn installed: the build record exists only for the test stand-in")
    return json.loads(record.content_string)


def test_standin_build_saw_computed_settings_under_ninja(host):
    stamp = _stamp(host)
    record = _standin_record(host)
    jobs = str(stamp["max_jobs"])
    assert record["ninja_jobs"] == jobs
    builds = host.file(f"{FA_BUILD_DIR}/builds.log").content_string.splitlines()
    nvcc_threads = re.search(r"NVCC_THREADS=(\d+)", builds[-1]).group(1)
    assert record["kernels"], record
    for kernel, env in record["kernels"].items():
        assert env["PARENT"] == "ninja", kernel
        assert env["MAX_JOBS"] == jobs, (kernel, env)
        assert env["MAKEFLAGS"] == f"-j{jobs}", (kernel, env)
        assert env["NVCC_THREADS"] == nvcc_threads, (kernel, env)
        assert env["FLASH_ATTN_CUDA_ARCHS"] == stamp["archs"] == "120", (kernel, env)
        assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE", (kernel, env)
        assert env["CUDA_HOME"], (kernel, env)


def test_standin_built_once_second_run_skipped(host):
    _standin_record(host)
    builds = host.file(f"{FA_BUILD_DIR}/builds.log").content_string.splitlines()
    assert len(builds) == 1, builds
