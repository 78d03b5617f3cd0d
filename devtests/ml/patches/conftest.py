"""Imports vllm from a patched overlay of the installed vLLM (see overlay.py).

The overlay goes first on sys.path at collection time, before any test imports
vllm; tests that import vllm later in the same pytest session see the patched
tree too (the installed .venv-ml is never modified). A vllm imported before this
file is loaded would make these tests check the wrong tree: refuse that loudly.
"""

from __future__ import annotations

import atexit
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overlay

if "vllm" in sys.modules:
    raise RuntimeError(
        "vllm was imported before devtests/ml/patches/conftest.py: run these tests in "
        "their own pytest session (PYTHONPATH=src .venv-ml/bin/python -m pytest "
        "devtests/ml/patches)"
    )

PATCHED_SITE = overlay.make_overlay(overlay.overlay_dir("patched"), overlay.patches())
sys.path.insert(0, str(PATCHED_SITE))
atexit.register(shutil.rmtree, PATCHED_SITE, True)
