"""Post-deploy checks of the GPU stack (roles nvidia_driver and cuda_toolkit).

GPU checks skip, with a reason, on hosts without nvidia-smi (the molecule
containers); set GLM5_EXPECTED_GPUS / GLM5_DRIVER_BRANCH / GLM5_CUDA_VERSION /
GLM5_MIN_CC to check other values than the defaults (8 GPUs, 580, 13.0, 12.0).
"""

import csv
import io
import os
import re

import pytest

BRANCH = os.environ.get("GLM5_DRIVER_BRANCH", "580")
EXPECTED_GPUS = int(os.environ.get("GLM5_EXPECTED_GPUS", "8"))
CUDA = os.environ.get("GLM5_CUDA_VERSION", "13.0")
MIN_CC = os.environ.get("GLM5_MIN_CC", "12.0")
CUDA_HOME = os.environ.get("GLM5_CUDA_HOME", f"/usr/local/cuda-{CUDA}")


def _cc(text):
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


@pytest.fixture()
def gpus(host):
    if not host.exists("nvidia-smi"):
        pytest.skip("no nvidia-smi on this host (no GPU): GPU checks run on the GPU machine")
    out = host.check_output(
        "nvidia-smi --query-gpu=index,driver_version,compute_cap,mig.mode.current,ecc.mode.current"
        " --format=csv,noheader"
    )
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out), skipinitialspace=True) if row]


@pytest.fixture()
def apt_host(host):
    sources = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources")
    if not host.exists("dpkg-query") or not sources.exists:
        pytest.skip("role nvidia_driver did not set up an apt repository on this host")
    return host


def test_driver_loaded_gpu_count(gpus):
    assert len(gpus) == EXPECTED_GPUS


def test_driver_version_on_branch(host, gpus):
    versions = {g[1] for g in gpus}
    assert {v.split(".")[0] for v in versions} == {BRANCH}, versions
    loaded = host.file("/sys/module/nvidia/version")
    if loaded.exists:
        assert loaded.content_string.strip() in versions


def test_compute_capability(gpus):
    low = [g for g in gpus if _cc(g[2]) < _cc(MIN_CC)]
    assert not low, f"GPUs below compute capability {MIN_CC}: {low}"


def test_mig_off(gpus):
    assert all(g[3] in ("Disabled", "[N/A]") for g in gpus), gpus


def test_nvcc_version(host):
    nvcc = host.file(f"{CUDA_HOME}/bin/nvcc")
    if not nvcc.exists:
        pytest.skip(f"no nvcc at {CUDA_HOME}")
    out = host.check_output(f"{CUDA_HOME}/bin/nvcc --version")
    assert f"release {CUDA}," in out


def test_profile_exports_cuda_home(apt_host):
    profile = apt_host.file("/etc/profile.d/cuda-toolkit.sh")
    assert profile.exists
    assert f"CUDA_HOME={CUDA_HOME}" in profile.content_string


def test_repository_signed_by(apt_host):
    sources = apt_host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").content_string
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in sources
    assert "trusted" not in sources.lower()
    assert apt_host.file("/etc/apt/keyrings/nvidia-cuda.asc").exists
    legacy = apt_host.check_output("ls /etc/apt/sources.list.d/")
    assert ".list" not in legacy or "cuda-" not in legacy


def test_driver_and_toolkit_held(apt_host):
    held = apt_host.check_output("apt-mark showhold").split()
    assert f"nvidia-open-{BRANCH}" in held or f"cuda-drivers-{BRANCH}" in held
    assert f"libnvidia-compute-{BRANCH}" in held
    assert f"cuda-toolkit-{CUDA.replace('.', '-')}" in held
    assert f"nvidia-driver-pinning-{BRANCH}" in held


def test_branch_pinned_by_nvidias_pinning_package(apt_host):
    """The branch comes from NVIDIA's nvidia-driver-pinning-<branch>
    (here its fake_nvidia_repo double), installed before the driver; the repository's
    nvidia-persistenced of the newer branch 590 is not taken."""
    status = apt_host.check_output(f"dpkg-query -W -f='${{db:Status-Status}}' nvidia-driver-pinning-{BRANCH}")
    assert status == "installed"
    version = apt_host.check_output("dpkg-query -W -f='${Version}' nvidia-persistenced")
    assert version.startswith(f"{BRANCH}."), version


def test_own_pin_names_nvidias_origin_only(apt_host):
    """The role's own preferences no longer pin a version glob for every
    origin; they name NVIDIA's repository (Origin NVIDIA, Label NVIDIA CUDA), and apt
    applies them to its packages of the branch."""
    pref = apt_host.file("/etc/apt/preferences.d/nvidia-driver-pin.pref").content_string
    pins = [line for line in pref.splitlines() if line.startswith("Pin:")]
    assert pins == ["Pin: release o=NVIDIA, l=NVIDIA CUDA"], pins
    policy = apt_host.check_output(f"apt-cache policy libnvidia-compute-{BRANCH}")
    assert re.search(rf"^ +(\*\*\* )?{BRANCH}\.\S+ 600$", policy, re.M), policy


def test_unattended_upgrades_excluded(apt_host):
    conf = apt_host.file("/etc/apt/apt.conf.d/51nvidia-driver-no-unattended").content_string
    assert "Unattended-Upgrade::Package-Blacklist" in conf
    assert '"^nvidia-";' in conf


def test_nouveau_blacklisted(apt_host):
    conf = apt_host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string
    assert "blacklist nouveau" in conf


def test_persistenced_enabled(host):
    svc = host.service("nvidia-persistenced")
    if not host.exists("systemctl") or host.run("systemctl is-system-running").rc == 127:
        pytest.skip("systemd is not running here")
    units = ("/usr/lib/systemd/system", "/lib/systemd/system")
    if not any(host.file(f"{d}/nvidia-persistenced.service").exists for d in units):
        pytest.skip("nvidia-persistenced is not installed")
    assert svc.is_enabled
