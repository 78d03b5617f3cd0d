"""Make the python_env roles' filter plugins importable as modules."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for plugin_dir in (ROOT / "roles/ml_env/filter_plugins", ROOT / "roles/flash_attn/filter_plugins"):
    sys.path.insert(0, str(plugin_dir))
