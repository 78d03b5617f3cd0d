"""Make role glm5's filter plugins importable as modules."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles/glm5/filter_plugins"))
