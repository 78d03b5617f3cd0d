"""Unit tests of the gpu_tuning helpers: the ACS walk and the power settings."""

import json
from pathlib import Path

import pytest
from load_file import load_file

FILES = Path(__file__).resolve().parents[2] / "roles" / "gpu_tuning" / "files"


def _load(name):
    return load_file(FILES / f"{name}.py")


acs = _load("glm5_acs_disable")
power = _load("glm5_gpu_power")


def _device(root, chain, vendor, cls):
    path = root / "devices" / "/".join(chain)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "class").write_text(cls + "\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(path)


@pytest.fixture
def sysfs(tmp_path):
    # root port 00:01.0 -> switch up 01:00.0 -> switch down 02:00.0 / 02:01.0 -> GPUs
    up = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    _device(tmp_path, up[:2], "0x8086", "0x060400")
    _device(tmp_path, up, "0x1000", "0x060400")
    _device(tmp_path, [*up, "0000:02:00.0"], "0x1000", "0x060400")
    _device(tmp_path, [*up, "0000:02:01.0"], "0x1000", "0x060400")
    _device(tmp_path, [*up, "0000:02:00.0", "0000:03:00.0"], "0x10de", "0x030200")
    _device(tmp_path, [*up, "0000:02:00.0", "0000:03:00.1"], "0x10de", "0x040300")  # audio
    _device(tmp_path, [*up, "0000:02:01.0", "0000:04:00.0"], "0x10de", "0x030000")
    _device(tmp_path, ["pci0000:80", "0000:80:02.0"], "0x15b3", "0x020000")  # NIC
    return tmp_path


def test_finds_gpus_not_audio_or_nic(sysfs):
    names = [p.name for p in acs.nvidia_gpus(sysfs)]
    assert names == ["0000:03:00.0", "0000:04:00.0"]


def test_bridges_above_gpus(sysfs):
    assert acs.bridges_above(acs.nvidia_gpus(sysfs)) == [
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:02:01.0",
    ]


class FakeSetpci:
    def __init__(self, regs):
        self.regs = dict(regs)
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        bdf, reg = argv[2], argv[3]
        if bdf not in self.regs:
            return 1, "Capability not found"
        if "=" in reg:
            self.regs[bdf] = reg.split("=")[1]
            return 0, ""
        return 0, self.regs[bdf]


def test_disable_acs_clears_only_bridges_with_acs():
    fake = FakeSetpci({"0000:01:00.0": "001d", "0000:02:00.0": "0000"})
    changed = acs.disable_acs(["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"], "setpci", fake, False)
    assert changed == ["0000:01:00.0"]
    assert fake.regs["0000:01:00.0"] == "0000"


def test_disable_acs_dry_run_changes_nothing():
    fake = FakeSetpci({"0000:01:00.0": "001d"})
    assert acs.disable_acs(["0000:01:00.0"], "setpci", fake, True) == ["0000:01:00.0"]
    assert fake.regs["0000:01:00.0"] == "001d"


def test_acs_main_without_gpus(tmp_path, capsys):
    assert acs.main(["--sysfs", str(tmp_path)], run=FakeSetpci({})) == 0
    assert "0 NVIDIA GPU(s)" in capsys.readouterr().out


CONFIG = {
    "persistence": True,
    "override_w": 0,
    "locked_clocks": "",
    "limits": [
        {"match": "RTX PRO 6000 Blackwell Max-Q", "watts": 300},
        {"match": "RTX PRO 6000 Blackwell Workstation", "watts": 600},
        {"match": "RTX PRO 6000 Blackwell Server", "watts": 600},
    ],
}
MAXQ = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
WS = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


@pytest.mark.parametrize(
    ("name", "watts"),
    [
        (MAXQ, 300),
        (WS, 600),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 600),
        ("NVIDIA H200", 0),
    ],
)
def test_target_watts_table_order(name, watts):
    assert power.target_watts(name, CONFIG) == watts


def test_override_wins():
    assert power.target_watts("NVIDIA H200", {**CONFIG, "override_w": 450}) == 450


class FakeSmi:
    def __init__(self, gpus):
        self.gpus = gpus  # list of [name, limit, max, persistence]
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv[1:])
        if argv[1].startswith("--query-gpu"):
            lines = [f"{i}, {g[0]}, {g[1]:.2f}, {g[2]:.2f}, {g[3]}" for i, g in enumerate(self.gpus)]
            return 0, "\n".join(lines)
        if argv[1] == "-pm":
            for g in self.gpus:
                g[3] = "Enabled"
            return 0, ""
        if argv[3] == "-pl":
            self.gpus[int(argv[2])][1] = float(argv[4])
            return 0, ""
        return 0, ""


def _config_file(tmp_path, config):
    path = tmp_path / "gpu-power.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_apply_then_verify(tmp_path):
    smi = FakeSmi([[MAXQ, 250.0, 300.0, "Disabled"], [WS, 500.0, 600.0, "Disabled"]])
    cfg = _config_file(tmp_path, CONFIG)
    assert power.main(["--config", cfg, "--check"], run=smi) == 1
    assert power.main(["--config", cfg], run=smi) == 0
    assert ["-i", "0", "-pl", "300"] in smi.calls and ["-i", "1", "-pl", "600"] in smi.calls
    assert power.main(["--config", cfg, "--check"], run=smi) == 0


def test_refuses_limit_above_board_maximum(tmp_path, capsys):
    smi = FakeSmi([[MAXQ, 300.0, 300.0, "Enabled"]])
    cfg = _config_file(tmp_path, {**CONFIG, "override_w": 600})
    assert power.main(["--config", cfg], run=smi) == 1
    assert "above its maximum" in capsys.readouterr().err


def test_locked_clocks(tmp_path):
    smi = FakeSmi([[WS, 600.0, 600.0, "Enabled"]])
    cfg = _config_file(tmp_path, {**CONFIG, "locked_clocks": "1500,2400"})
    assert power.main(["--config", cfg], run=smi) == 0
    assert ["-i", "0", "-lgc", "1500,2400"] in smi.calls


def test_parse_query_na():
    gpus = power.parse_query("0, NVIDIA X, [N/A], [N/A], Enabled\n")
    assert gpus[0].limit_w == 0.0 and gpus[0].persistence
