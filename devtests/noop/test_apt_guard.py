"""The no-op shortcut's apt guards (roles/glm5/tasks/apt.yml) skip an install only when
apt's state=present would find nothing to do; everything else lets apt run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

QUERY = (
    "nvidia-open-580 580.95.05-0ubuntu1 hold installed\n"
    "nvidia-driver-pinning-580 580.95.05-1 install installed\n"
    "cuda-toolkit-12-9 12.9.1-1 install installed\n"
    "patch 2.7.6-7 install installed\n"
    "nftables 1.0.9-1 deinstall config-files\n"
    "pciutils 1:3.10.0-2 install half-configured\n"
    "libc6 2.39-0ubuntu8 hold installed\n"
    "libc6 2.39-0ubuntu8 install installed\n"
    "libfoo 1.0-1 install installed\n"
    "libfoo 1.1-1 install installed\n"
    "garbage line\n"
)


@pytest.fixture()
def state(pkgs):
    return pkgs.dpkg_state(QUERY)


def test_parse(state):
    assert state["nvidia-open-580"] == {"version": "580.95.05-0ubuntu1", "want": "hold", "status": "installed"}
    assert "garbage" not in state
    # Multi-arch copies that disagree keep no value for what differs.
    assert state["libc6"] == {"version": "2.39-0ubuntu8", "want": "", "status": "installed"}
    assert state["libfoo"]["version"] == ""


@pytest.mark.parametrize(
    "packages",
    [
        "patch",
        ["patch"],
        ["nvidia-open-580=580.95.05*", "nvidia-driver-pinning-580"],
        ["cuda-toolkit-12-9=12.9.1-1"],
        [],
    ],
)
def test_satisfied(pkgs, state, packages):
    assert pkgs.apt_satisfied(packages, state) is True


@pytest.mark.parametrize(
    "packages",
    [
        ["patch", "gnupg"],  # gnupg not installed
        ["nftables"],  # only its config files are left
        ["pciutils"],  # half-configured
        ["nvidia-open-580=580.82*"],  # another version installed
        ["cuda-toolkit-12-9=12.9.1"],  # exact version without the revision: apt would not match either
        ["libfoo=1.0-1"],  # two copies at different versions
        ["patch>=2.7"],  # a relation: apt decides
        ["patch:amd64"],  # an architecture qualifier: apt decides
        ["/tmp/x.deb"],  # a file: apt decides
        ["Patch"],  # not a Debian package name
    ],
)
def test_not_satisfied(pkgs, state, packages):
    assert pkgs.apt_satisfied(packages, state) is False


def test_state_not_read_is_never_satisfied(pkgs):
    assert pkgs.apt_satisfied(["patch"], None) is False
    assert pkgs.dpkg_unheld(["patch=1*", "gnupg"], None) == ["patch", "gnupg"]


def test_refuses_a_mapping(pkgs, state):
    with pytest.raises(TypeError, match="packages must be"):
        pkgs.apt_satisfied({"patch": 1}, state)


def test_unheld(pkgs, state):
    names = ["nvidia-open-580=580.95.05*", "nvidia-driver-pinning-580", "libc6", "gnupg"]
    # libc6: one copy held, one not -> not counted as held; gnupg: not installed -> listed
    assert pkgs.dpkg_unheld(names, state) == ["nvidia-driver-pinning-580", "libc6", "gnupg"]


def test_driver_hold_list_reads_the_state(drv, state):
    held = drv.driver_hold_list(state, ["^nvidia-"], [])
    assert held == ["nvidia-driver-pinning-580", "nvidia-open-580"]


def _task_format() -> str:
    tasks = yaml.safe_load((ROOT / "roles/glm5/tasks/dpkg_state.yml").read_text())
    argv = tasks[0]["ansible.builtin.command"]["argv"]
    return next(a for a in argv if a.startswith("-f="))[3:]


def test_task_uses_the_format_the_filter_parses(pkgs):
    assert _task_format() == pkgs.DPKG_QUERY_FORMAT


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
def test_real_dpkg_query(pkgs):
    """The task's query on this machine's real dpkg: dpkg itself is installed at the
    version dpkg reports, and not at a made-up one."""
    fmt = _task_format().replace("\\n", "\n")
    out = subprocess.run(["dpkg-query", "-W", f"-f={fmt}"], check=True, capture_output=True, text=True).stdout
    state = pkgs.dpkg_state(out)
    version = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "dpkg"], check=True, capture_output=True, text=True
    ).stdout
    assert state["dpkg"]["status"] == "installed"
    assert pkgs.apt_satisfied(["dpkg", f"dpkg={version}"], state)
    assert not pkgs.apt_satisfied(["dpkg=0.0.1*"], state)
    assert not pkgs.apt_satisfied(["glm5-no-such-package"], state)
