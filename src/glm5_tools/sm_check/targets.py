"""Per-target hardware limits the check judges against.

Numbers are the CUDA C++ Programming Guide's "Technical Specifications per
Compute Capability" table (the opt-in maximum of shared memory per block is what
Triton's launcher compares a kernel's shared memory with: the driver attribute
cudaDevAttrMaxSharedMemoryPerBlockOptin):

=========  ==========================  ================  =========================
target     shared memory / block       registers / SM    max registers / thread
=========  ==========================  ================  =========================
sm_90      227 KB = 232448 bytes       65536             255
sm_100     227 KB = 232448 bytes       65536             255
sm_120     99 KB = 101376 bytes        65536             255
=========  ==========================  ================  =========================

SM counts are those of the cards this project runs on or validates with: the
RTX PRO 6000 Blackwell (188 SMs, compute capability 12.0) and the H200 (132 SMs,
9.0); they matter where a launch site sizes its grid or splits by SM count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Warpgroup MMA (wgmma: HGMMA/IGMMA/QGMMA/BGMMA in SASS), tensor memory MMA and
# its loads/stores (tcgen05: UTC*), TMA tensor copies (UTMALDG/UTMASTG/UTMAPF/
# UTMACCTL/UTMACMDFLUSH), bulk copies (UBLKCP/UBLKRED/UBLKPF), cluster
# multicast, and register reallocation between warpgroups (setmaxnreg:
# USETMAXREG). SM 12.x has no wgmma and no tcgen05; ptxas refuses those for
# sm_120, so a hit on an sm_120 cubin is a toolchain surprise worth a look on
# the card. TMA and bulk copies exist on SM 12.x, but none of this service's
# kernels is written for them: a hit means the kernel changed shape and must be
# looked at on the card before it is trusted (conservative on purpose).
HOPPER_ONLY_SASS: tuple[str, ...] = (
    "HGMMA",
    "IGMMA",
    "QGMMA",
    "BGMMA",
    "UTCHMMA",
    "UTCIMMA",
    "UTCQMMA",
    "UTCOMMA",
    "UTCBAR",
    "UTCCP",
    "UTCSHIFT",
    "UTMALDG",
    "UTMASTG",
    "UTMAPF",
    "UTMACCTL",
    "UTMACMDFLUSH",
    "UBLKCP",
    "UBLKRED",
    "UBLKPF",
    "MULTICAST",
    "USETMAXREG",
)


@dataclass(frozen=True)
class Target:
    name: str
    capability: int  # 120 for 12.0
    sm_count: int
    smem_per_block: int  # opt-in maximum, bytes
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    forbidden_sass: tuple[str, ...] = field(default=())
    card: str = ""

    @property
    def major(self) -> int:
        return self.capability // 10

    @property
    def minor(self) -> int:
        return self.capability % 10


TARGETS: dict[str, Target] = {
    "sm_120": Target("sm_120", 120, 188, 101376, forbidden_sass=HOPPER_ONLY_SASS, card="NVIDIA RTX PRO 6000 Blackwell"),
    "sm_90": Target("sm_90", 90, 132, 232448, card="NVIDIA H200"),
    "sm_100": Target("sm_100", 100, 148, 232448, card="NVIDIA B200"),
}


def target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}: one of {', '.join(sorted(TARGETS))}") from None
