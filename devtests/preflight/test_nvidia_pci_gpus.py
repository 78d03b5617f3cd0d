"""Unit tests of the preflight role's sysfs GPU scan."""

from pathlib import Path

from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]
mod = load_file(ROOT / "roles/preflight/library/nvidia_pci_gpus.py")


def _dev(root: Path, addr: str, vendor: str, device: str, cls: str, numa: str = "0") -> None:
    d = root / addr
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")
    (d / "class").write_text(cls + "\n")
    (d / "numa_node").write_text(numa + "\n")


def test_finds_nvidia_display_controllers_only(tmp_path):
    _dev(tmp_path, "0000:17:00.0", "0x10de", "0x2bb1", "0x030200")
    _dev(tmp_path, "0000:03:00.0", "0x10de", "0x2bb1", "0x030000", "1")
    _dev(tmp_path, "0000:00:1f.3", "0x8086", "0xa0c8", "0x040300")  # Intel audio
    _dev(tmp_path, "0000:17:00.1", "0x10de", "0x22e8", "0x040300")  # GPU's HDMI audio
    _dev(tmp_path, "0000:aa:00.0", "0x10de", "0x22a3", "0x068000")  # NVSwitch
    found = mod.scan(tmp_path)
    assert [g["address"] for g in found["gpus"]] == ["0000:03:00.0", "0000:17:00.0"]
    assert found["gpus"][0]["numa_node"] == 1
    assert [s["address"] for s in found["nvswitches"]] == ["0000:aa:00.0"]


def test_missing_sysfs_means_no_gpus(tmp_path):
    assert mod.scan(tmp_path / "absent") == {"gpus": [], "nvswitches": []}


def test_unreadable_numa_is_minus_one(tmp_path):
    _dev(tmp_path, "0000:17:00.0", "0x10de", "0x2bb1", "0x030200", "")
    assert mod.scan(tmp_path)["gpus"][0]["numa_node"] == -1
