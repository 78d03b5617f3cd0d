"""playbooks/diagnose.yml parses, is tagged diagnose, and is not imported by site.yml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_syntax_check():
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
         str(ROOT / "playbooks" / "diagnose.yml")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tagged_and_prefixed_and_not_in_site():
    (play,) = yaml.safe_load((ROOT / "playbooks" / "diagnose.yml").read_text())
    assert play["tags"] == ["diagnose"] and play["hosts"] == "gpu_servers"
    assert all(k.startswith("diagnose_") for k in play["vars"])
    site = ROOT / "site.yml"
    if site.exists():
        assert "playbooks/diagnose.yml" not in [
            line.split("import_playbook:")[-1].strip()
            for line in site.read_text().splitlines() if "import_playbook" in line
        ]
