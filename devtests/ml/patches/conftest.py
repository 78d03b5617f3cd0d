"""Imports vllm from a patched overlay of the installed vLLM (see overlay.py).

The overlay must come first on sys.path before any test imports vllm.
"""

from __future__ import annotations

import atexit
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overlay

if "vllm" not in sys.modules:
    _SITE = overlay.make_overlay(overlay.overlay_dir("patched"), overlay.patches())
    sys.path.insert(0, str(_SITE))
    atexit.register(shutil.rmtree, _SITE, True)
    PATCHED_SITE = _SITE
