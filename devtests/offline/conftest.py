"""Make the offline bundle modules importable."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for module_dir in (ROOT / "roles/glm5/library", ROOT / "roles/offline_bundle/library"):
    sys.path.insert(0, str(module_dir))
