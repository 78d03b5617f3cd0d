"""The funnel's tests check vLLM as deployed: the patched tree (an overlay of the installed
vLLM with the project's patch set, devtests/ml/patches/overlay.py) goes first on the path
before any test imports vllm. Stage 4 runs vLLM's GGUF layer code, which the set fixes."""

from __future__ import annotations

import atexit
import shutil
import sys
from pathlib import Path

PATCHES = Path(__file__).resolve().parents[1] / "patches"
sys.path.insert(0, str(PATCHES))

import overlay  # noqa: E402

if "vllm" in sys.modules:
    raise RuntimeError("vllm was imported before devtests/ml/diagnostics/conftest.py: run these tests "
                       "in their own pytest session")

PATCHED_SITE = overlay.make_overlay(overlay.overlay_dir("diagnostics"), overlay.patches())
sys.path.insert(0, str(PATCHED_SITE))
atexit.register(shutil.rmtree, PATCHED_SITE, True)
