"""Unit tests of role nvidia_driver's filters."""

import pytest

FIELDS = ["index", "name", "driver_version", "compute_cap", "mig.mode.current", "ecc.mode.current"]

# As printed by nvidia-smi 580 on an H200 and on a PCIe Blackwell board.
H200 = "0, NVIDIA H200, 580.159.04, 9.0, Disabled, Enabled\n"
EIGHT = "".join(
    f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05, 12.0, [N/A], Enabled\n" for i in range(8)
)


def test_csv_one_gpu(drv):
    rows = drv.nvidia_smi_csv(H200, FIELDS)
    assert rows == [
        {
            "index": "0",
            "name": "NVIDIA H200",
            "driver_version": "580.159.04",
            "compute_cap": "9.0",
            "mig_mode_current": "Disabled",
            "ecc_mode_current": "Enabled",
        }
    ]


def test_csv_eight_gpus_not_available_is_none(drv):
    rows = drv.nvidia_smi_csv(EIGHT + "\n", FIELDS)
    assert len(rows) == 8
    assert rows[7]["index"] == "7"
    assert rows[0]["mig_mode_current"] is None
    assert {r["compute_cap"] for r in rows} == {"12.0"}


def test_csv_name_with_comma_quoted(drv):
    rows = drv.nvidia_smi_csv('0, "Odd, Name", 580.1, 12.0, Disabled, Disabled\n', FIELDS)
    assert rows[0]["name"] == "Odd, Name"


def test_csv_wrong_columns_refused(drv):
    with pytest.raises(ValueError, match="expected 6"):
        drv.nvidia_smi_csv("0, NVIDIA H200\n", FIELDS)


def test_csv_empty(drv):
    assert drv.nvidia_smi_csv("", FIELDS) == []
    with pytest.raises(ValueError):
        drv.nvidia_smi_csv(H200, [])


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("580.159.04\n", "580.159.04"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
            "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 1 00:00:00 UTC 2026\n"
            "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
            "580.159.04",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Mon Mar 10 2025\n",
            "570.133.20",
        ),
        ("", ""),
        ("garbage\n", ""),
    ],
)
def test_loaded_driver_version(drv, text, version):
    assert drv.nvidia_loaded_driver_version(text) == version


def test_branch_of(drv):
    assert drv.nvidia_driver_branch_of("580.159.04") == "580"
    assert drv.nvidia_driver_branch_of("") == ""
    with pytest.raises(ValueError):
        drv.nvidia_driver_branch_of("abc")


@pytest.mark.parametrize(
    ("cc", "minimum", "ok"),
    [
        ("9.0", "12.0", False),
        ("12.0", "12.0", True),
        ("12.1", "12.0", True),
        ("10.0", "9.0", True),
        ("8.9", "9.0", False),
        ("12", "12.0", True),
    ],
)
def test_compute_capability(drv, cc, minimum, ok):
    assert drv.compute_capability_at_least(cc, minimum) is ok


def test_compute_capability_bad(drv):
    with pytest.raises(ValueError):
        drv.compute_capability_at_least("sm_120", "12.0")


def test_gpus_below_compute_capability(drv):
    gpus = [
        {"index": "0", "compute_cap": "9.0"},
        {"index": "1", "compute_cap": "12.0"},
        {"index": "2", "compute_cap": None},
    ]
    low = drv.gpus_below_compute_capability(gpus, "12.0")
    assert [g["index"] for g in low] == ["0", "2"]
    assert [g["index"] for g in drv.gpus_below_compute_capability(gpus, "9.0")] == ["2"]


def test_nvswitch_count(drv):
    sysfs = "0x10de 0x030200\n0x10de 0x068000\n0x10de 0x068000\n0x8086 0x068000\n0x10de\n"
    assert drv.nvidia_nvswitch_count(sysfs) == 2
    assert drv.nvidia_nvswitch_count("0x10de 0x030000\n") == 0


def test_dkms_missing(drv):
    status = (
        "nvidia/580.95.05, 6.8.0-45-generic, x86_64: installed\n"
        "nvidia/580.95.05, 6.8.0-49-generic, x86_64: built\n"
        "other/1.0, 6.8.0-49-generic, x86_64: installed\n"
    )
    assert drv.dkms_missing_kernels(status, ["6.8.0-45-generic", "6.8.0-49-generic"]) == ["6.8.0-49-generic"]
    old = "nvidia, 580.95.05, 6.8.0-49-generic, x86_64: installed\n"
    assert drv.dkms_missing_kernels(old, ["6.8.0-49-generic"]) == []
    assert drv.dkms_missing_kernels("", ["k"]) == ["k"]


def test_kernel_flavour(drv):
    assert drv.kernel_flavour("6.8.0-45-generic") == "generic"
    assert drv.kernel_flavour("6.11.0-1008-nvidia-64k") == "nvidia-64k"
    with pytest.raises(ValueError):
        drv.kernel_flavour("6.12.48+deb13-amd64")


def test_filter_module_lists_all(drv):
    names = set(drv.FilterModule().filters())
    assert {"nvidia_smi_csv", "nvidia_loaded_driver_version", "dkms_missing_kernels"} <= names


# dpkg-query -W -f='${Package} ${db:Status-Status}\n' on an Ubuntu host of the
# Secure Boot path after a kernel upgrade (6.8.0-50 installed, its signed module not).
DPKG_UPGRADED = (
    "linux-generic installed\n"
    "linux-image-generic installed\n"
    "linux-headers-generic installed\n"
    "linux-image-6.8.0-45-generic installed\n"
    "linux-image-6.8.0-50-generic installed\n"
    "linux-modules-nvidia-580-open-generic installed\n"
    "linux-modules-nvidia-580-open-6.8.0-45-generic installed\n"
    "linux-modules-nvidia-580-open-6.8.0-50-generic config-files\n"
    "nvidia-utils-580 installed\n"
    "nvidia-headless-no-dkms-580-open installed\n"
    "libc6 installed\n"
)


def test_precompiled_missing_kernels(drv):
    """A kernel in /boot without Ubuntu's signed module package for it
    boots without a GPU. Failed first: the filter did not exist (AttributeError)."""
    kernels = ["6.8.0-45-generic", "6.8.0-50-generic"]
    assert drv.precompiled_missing_kernels(DPKG_UPGRADED, kernels, "580") == ["6.8.0-50-generic"]
    fine = DPKG_UPGRADED.replace("6.8.0-50-generic config-files", "6.8.0-50-generic installed")
    assert drv.precompiled_missing_kernels(fine, kernels, "580") == []
    assert drv.precompiled_missing_kernels(fine, kernels, "575") == kernels


def test_driver_hold_list_holds_kernel_meta_packages_with_the_signed_modules(drv):
    """On the Secure Boot path the kernel meta packages are held with the
    signed modules, so that no kernel arrives without its module. Failed first: only the
    driver name patterns were held (the filter did not exist)."""
    patterns = ["^nvidia-", "^libnvidia-", "^linux-modules-nvidia-"]
    metas = ["linux-generic", "linux-image-generic", "linux-headers-generic", "linux-hwe-24.04"]
    held = drv.driver_hold_list(DPKG_UPGRADED, patterns, metas)
    assert {"linux-generic", "linux-image-generic", "linux-headers-generic"} <= set(held)
    assert "linux-hwe-24.04" not in held  # not installed: nothing to hold
    assert "linux-modules-nvidia-580-open-generic" in held
    assert "nvidia-utils-580" in held
    assert "libc6" not in held and "linux-image-6.8.0-45-generic" not in held
    assert "linux-modules-nvidia-580-open-6.8.0-50-generic" not in held  # config-files only
    assert held == sorted(set(held))
    assert "linux-generic" not in drv.driver_hold_list(DPKG_UPGRADED, patterns, [])
