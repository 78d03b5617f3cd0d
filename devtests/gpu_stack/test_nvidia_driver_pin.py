"""Role nvidia_driver's own apt preferences name NVIDIA's origin only.

Renders templates/nvidia-driver-pin.pref.j2 as Ansible does (jinja2, the role's variables)
and checks what apt would read. The branch itself is pinned by NVIDIA's
nvidia-driver-pinning-<branch> package, not by this file.
Failed first: the template pinned `Pin: version 580.*` for every origin (Ubuntu's archive
packages of the same names were promoted to 1001 too).
"""

from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/nvidia_driver"


def render(branch: str, precompiled: bool) -> list[dict[str, str]]:
    env = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    text = env.from_string((ROLE / "templates/nvidia-driver-pin.pref.j2").read_text()).render(
        ansible_managed="managed",
        nvidia_driver_branch=branch,
        nvidia_driver_version="",
        nvidia_driver__use_precompiled=precompiled,
        **role_vars,
    )
    stanzas = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith("#") and ": " in line
        )
        if fields:
            stanzas.append(fields)
    return stanzas


@pytest.mark.parametrize("precompiled", [False, True])
def test_every_stanza_is_limited_to_nvidias_origin(precompiled):
    stanzas = render("580", precompiled)
    assert stanzas
    for s in stanzas:
        assert s["Pin"] == "release o=NVIDIA, l=NVIDIA CUDA", s
        assert not s["Pin"].startswith("version"), s


def test_nvidia_path_prefers_nvidias_packages_of_the_branch_only():
    (s,) = render("580", False)
    assert int(s["Pin-Priority"]) == 600  # above the archive's 500, below a forced downgrade
    names = s["Package"].split()
    assert names and all("580" in n for n in names), names  # branch-named packages only


def test_secure_boot_path_refuses_nvidias_driver_packages():
    """Ubuntu's signed modules come from Ubuntu's archive: the userspace must too."""
    stanzas = render("580", True)
    assert {int(s["Pin-Priority"]) for s in stanzas} == {-1}
    names = " ".join(s["Package"] for s in stanzas)
    for pattern in ("nvidia-*", "libnvidia-*", "cuda-drivers*"):
        assert pattern in names.split()
