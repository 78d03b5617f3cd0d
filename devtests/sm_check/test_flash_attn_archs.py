"""flash-attn is built for SM 12.0 where the role builds it.

flash-attn's setup takes its architectures from FLASH_ATTN_CUDA_ARCHS and ignores
TORCH_CUDA_ARCH_LIST: the role must pass its variable through that name, and the
default (and the inventory's commented example) must hold 120. vLLM itself does
not use this package (roles/flash_attn/README.md); vLLM's bundled
vllm_flash_attn is checked from the wheel by glm5_tools.sm_check (--libs).
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "flash_attn"


def test_default_archs_hold_sm120() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    assert "120" in str(defaults["flash_attn_cuda_archs"]).split(";")
    inventory = (ROOT / "inventory/production/group_vars/gpu_servers/main.yml").read_text(encoding="utf-8")
    assert '# flash_attn_cuda_archs: "120"' in inventory  # documented, not overridden


def test_build_passes_the_archs_as_flash_attn_reads_them() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "build.yml").read_text(encoding="utf-8"))
    text = str(tasks)
    assert "'FLASH_ATTN_CUDA_ARCHS': flash_attn_cuda_archs" in text
    # a wheel built for other archs is never reused: the cache folder and the stamp name them
    check = (ROLE / "tasks" / "check.yml").read_text(encoding="utf-8")
    assert "'-sm' ~ (flash_attn_cuda_archs" in check and "__stamp.archs" in check
