"""Tiled tensor-core W4A16 kernel (``w4a16_tc.cu``): its tile configurations and launch planning.

Same prepacked weights as the GEMV-like kernel of ``w4a16.py`` (``prepack``'s layout), so one
copy of a layer's weights serves both and the dispatcher (``w4a16_dispatch.py``) may pick either
per M. Layout, pipeline and split-K are described at the top of ``w4a16_tc.cu`` and in
docs/kernels_gpu.md.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGE_XROW_BYTES = 144  # one x row of a stage: 64 k * 2 B + 16 B of padding (bank conflicts)
MAX_SPLIT = 16
SMEM_PER_SM = 227 * 1024  # bytes a block may use on sm_90 (opt-in above 48 KiB)
REGS_PER_SM = 65536


@dataclass(frozen=True)
class TcConfig:
    """One block tile: BM = 8*mt*wm rows of x by BN = 16*ns*wn columns, 32*wm*wn threads, st
    pipeline stages of one 64-k chunk. ``regs``: ptxas's count on sm_90 (nvcc 13.0, bf16, g128;
    test_tc_ptxas_report keeps it honest), used to estimate blocks per SM.

    ``sa`` False (exact): the tensor cores multiply the integers (q - z) and each group's sum is
    scaled in fp32 (two accumulator sets: per group and total), as the GEMV-like kernel does.
    ``sa`` True (scaled A): the A fragment is (q - z) * s rounded once to bf16/fp16 (one more
    mul.rn.{bf16,f16}x2 per register; the scale itself is first rounded to that type), so one
    accumulator set suffices and a warp can hold twice the tile. The error is then that of a
    bf16/fp16 GEMM on the dequantized weights (what cuBLAS bf16 computes)."""

    mt: int
    ns: int
    wm: int
    wn: int
    st: int
    regs: int
    sa: bool = False

    @property
    def bm(self) -> int:
        return 8 * self.mt * self.wm

    @property
    def bn(self) -> int:
        return 16 * self.ns * self.wn

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def stage_bytes(self) -> int:
        strips = self.ns * self.wn
        return strips * 512 + strips * 64 + self.bm * STAGE_XROW_BYTES

    @property
    def smem(self) -> int:
        return self.st * self.stage_bytes

    @property
    def blocks_per_sm(self) -> int:
        by_regs = REGS_PER_SM // (max(self.regs, 1) * self.threads)
        return max(1, min(by_regs, SMEM_PER_SM // self.smem, 2048 // self.threads))


# name -> config (all 256 threads). Registers as reported by ptxas for sm_90, no spills in any.
TC_CONFIGS: dict[str, TcConfig] = {
    "tc16": TcConfig(mt=2, ns=1, wm=1, wn=8, st=4, regs=78),  # 16 x 128, exact
    "tc32": TcConfig(mt=4, ns=1, wm=1, wn=8, st=4, regs=106),  # 32 x 128, exact
    "tc64": TcConfig(mt=4, ns=2, wm=2, wn=4, st=4, regs=128),  # 64 x 128, exact
    "tc128": TcConfig(mt=8, ns=2, wm=2, wn=4, st=3, regs=210),  # 128 x 128, exact
    "tc64s": TcConfig(mt=4, ns=4, wm=2, wn=4, st=4, regs=147, sa=True),  # 64 x 256
    "tc128s": TcConfig(mt=8, ns=2, wm=2, wn=4, st=3, regs=144, sa=True),  # 128 x 128
    "tc128ws": TcConfig(mt=8, ns=4, wm=2, wn=4, st=3, regs=254, sa=True),  # 128 x 256
}


def tc_kernel_name(dtype: str, cfg_name: str, cpg: int) -> str:
    return f"w4a16{cfg_name}_{dtype}_c{cpg}"


def tc_instantiation(dt_code: int, dtype: str, cfg_name: str, cpg: int) -> str:
    c = TC_CONFIGS[cfg_name]
    name = tc_kernel_name(dtype, cfg_name, cpg)
    sa = "true" if c.sa else "false"
    return f"ANVIL_W4A16_TC_KERNEL({name}, {dt_code}, {c.mt}, {c.ns}, {c.wm}, {c.wn}, {c.st}, {cpg}, {sa})"


@dataclass(frozen=True)
class TcPlan:
    """Launch of one tc kernel: grid (M tiles, N tiles, split), block threads, dynamic shared
    memory bytes, workspace floats (0 when split == 1) and tile counters."""

    cfg: str
    grid: tuple[int, int, int]
    block: int
    smem: int
    split: int
    ws_floats: int
    tiles: int


def choose_split(
    tiles: int, groups: int, sm_count: int, blocks_per_sm: int, *, max_split: int = MAX_SPLIT
) -> int:
    """Split-K factor (a power of two, at most the groups along K): the one with the fewest waves
    per unit of work, plus 2% per split for the partial-sum traffic and the reduction."""
    slots = sm_count * blocks_per_sm
    best, best_cost = 1, float("inf")
    s = 1
    while s <= min(groups, max_split):
        cost = -(-tiles * s // slots) / s + 0.02 * s
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
        s *= 2
    return best


def plan_tc(
    m: int, n: int, k: int, g: int, cfg_name: str, *, sm_count: int = 132, split: int | None = None
) -> TcPlan:
    """Geometry of one launch of tc config ``cfg_name`` for (M, N, K) with groups of g."""
    if cfg_name not in TC_CONFIGS:
        raise ValueError(f"unknown tc config {cfg_name!r}; known: {sorted(TC_CONFIGS)}")
    if n % 16 != 0 or k % g != 0 or g % 64 != 0:
        raise ValueError(f"N={n} must be a multiple of 16 and K={k} a multiple of g={g} (a multiple of 64)")
    c = TC_CONFIGS[cfg_name]
    mtiles = -(-m // c.bm)
    ntiles = -(-n // c.bn)
    groups = k // g
    if split is None:
        split = choose_split(mtiles * ntiles, groups, sm_count, c.blocks_per_sm)
    if not 1 <= split <= groups:
        raise ValueError(f"split={split} must be in [1, {groups}] (the groups along K)")
    ws = mtiles * ntiles * split * c.bm * c.bn if split > 1 else 0
    return TcPlan(cfg_name, (mtiles, ntiles, split), c.threads, c.smem, split, ws, mtiles * ntiles)
