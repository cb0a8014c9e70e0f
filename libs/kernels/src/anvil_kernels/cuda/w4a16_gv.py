"""The GEMV-like W4A16 kernel with a shared-memory weight ring ("gv" configs, ``w4a16_gv.cu``).

Same prepacked weights (``prepack``), launch geometry (``plan_launch``: one strip per warp, split-K
inside the block) and math as the register-ring GEMV kernel of ``w4a16.cu``; only how the weights
reach a warp differs: a per-warp ring of ``nst`` stages of ``sc`` 64-k chunks (plus their scale
words) in shared memory, filled by cp.async (``load="cpasync"``, every lane its own 16 bytes) or by
bulk copies (``load="bulk"``, TMA without a tensor map: one instruction per stage, completing on an
mbarrier). The ring costs no registers, so a warp keeps 8-16 chunks (4-8 KiB) in flight where the
register ring kept 4. Built, not yet measured on the H200: the bench times every config and the
measured dispatch table picks per shape (docs/kernels_gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GvLoad = Literal["cpasync", "bulk"]
_LOAD_CODE: dict[str, int] = {"cpasync": 0, "bulk": 1}


@dataclass(frozen=True)
class GvConfig:
    """One gv kernel: loader, chunks per stage ``sc`` (raised to whole groups at g256), stages
    ``nst``, ``minb`` blocks of 512 threads per SM asked of ptxas (2: at most 64 registers),
    ``warps_per_sm`` (the launch plan's target of resident warps) and ``mt_max``, the tallest M tile
    instantiated (8 * mt_max rows per block; more rows take more M blocks, which re-read the
    weights from L2). ``regs``: ptxas's count per tile (mt = 1..mt_max) on sm_90a (nvcc 13.0, bf16,
    g128; test_gv_ptxas_report_and_sass keeps it honest, with no spills), which the planner's
    residency estimate reads."""

    load: GvLoad
    sc: int
    nst: int
    minb: int
    warps_per_sm: int
    mt_max: int
    regs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.regs) != self.mt_max:
            raise ValueError("regs: one count per tile, mt = 1..mt_max")

    def stage_chunks(self, cpg: int) -> int:
        """Chunks per stage at groups of 64 * cpg k: ``sc`` rounded up to whole groups."""
        return -(-self.sc // cpg) * cpg

    def stage_bytes(self, cpg: int) -> int:
        sc = self.stage_chunks(cpg)
        return sc * 512 + (sc // cpg) * 64

    def smem(self, cpg: int, warps: int, mt: int) -> int:
        """Dynamic shared memory of a block of ``warps`` warps (sn * sk): the layout at the top of
        w4a16_gv.cu (mbarriers padded to 128 B, the warps' rings, the split-K reduction)."""
        bars = -(-(warps * self.nst * 8) // 128) * 128 if self.load == "bulk" else 0
        return bars + warps * self.nst * self.stage_bytes(cpg) + warps * mt * 512

    def resident_warps(self, cpg: int, warps: int, mt: int) -> int:
        """Warps per SM that the H200 holds at once for blocks of ``warps`` warps: by registers
        (``regs`` rounded up to 8 a thread), shared memory (228 KiB an SM, 1 KiB reserved a block)
        and 64 warps."""
        regs = -(-self.regs[mt - 1] // 8) * 8
        blocks = min(65536 // (regs * 32 * warps), (228 * 1024) // (self.smem(cpg, warps, mt) + 1024), 32)
        return min(blocks * warps, 64 // warps * warps)


# name -> config. 16 warps/SM of 8-16 chunks each (64-136 KiB of shared memory per SM in flight),
# or 32 warps/SM of 8 chunks with at most 64 registers (one 8-row tile only: two spill there).
GV_CONFIGS: dict[str, GvConfig] = {
    "gvc8": GvConfig("cpasync", sc=2, nst=4, minb=1, warps_per_sm=16, mt_max=2, regs=(59, 84)),
    "gvc16": GvConfig("cpasync", sc=4, nst=4, minb=1, warps_per_sm=16, mt_max=2, regs=(61, 85)),
    "gvb16": GvConfig("bulk", sc=4, nst=4, minb=1, warps_per_sm=16, mt_max=2, regs=(61, 84)),
    "gvc8w": GvConfig("cpasync", sc=2, nst=4, minb=2, warps_per_sm=32, mt_max=1, regs=(59,)),
    "gvb8w": GvConfig("bulk", sc=4, nst=2, minb=2, warps_per_sm=32, mt_max=1, regs=(59,)),
}


def gv_kernel_name(dtype: str, cfg_name: str, mt: int, cpg: int) -> str:
    return f"w4a16{cfg_name}_{dtype}_m{mt}_c{cpg}"


def gv_instantiations(dt_code: int, dtype: str, cfg_name: str, cpg: int) -> list[str]:
    """The ``ANVIL_W4A16_GV_KERNEL`` lines of one config at one dtype and group: mt = 1..mt_max."""
    c = GV_CONFIGS[cfg_name]
    out = []
    for mt in range(1, c.mt_max + 1):
        name = gv_kernel_name(dtype, cfg_name, mt, cpg)
        args = (
            f"{name}, {dt_code}, {mt}, {cpg}, {_LOAD_CODE[c.load]}, {c.stage_chunks(cpg)}, {c.nst}, {c.minb}"
        )
        out.append(f"ANVIL_W4A16_GV_KERNEL({args})")
    return out
