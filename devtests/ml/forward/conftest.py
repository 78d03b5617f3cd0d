"""vLLM's whole forward pass on the CPU: the patched tree (an overlay of the installed vLLM
with the project's patch set, devtests/ml/patches/overlay.py) goes first on the path, and
Triton's interpreter is switched on, before anything imports vllm or triton."""

from __future__ import annotations

import atexit
import shutil
import sys
from pathlib import Path

PATCHES = Path(__file__).resolve().parents[1] / "patches"
sys.path.insert(0, str(PATCHES))

import overlay  # noqa: E402

from glm5_tools.diagnostics.vllm_forward import prepare_environment  # noqa: E402

if "vllm" in sys.modules:
    raise RuntimeError("vllm was imported before devtests/ml/forward/conftest.py: run these tests "
                       "in their own pytest session")

prepare_environment()
PATCHED_SITE = overlay.make_overlay(overlay.overlay_dir("forward"), overlay.patches())
sys.path.insert(0, str(PATCHED_SITE))
atexit.register(shutil.rmtree, PATCHED_SITE, True)
