"""The Marlin-like tensor-core W4A16 kernel (``w4a16_mtc.cu``): its weight layout (``prepack_mtc``,
``unprepack_mtc``), tile configurations and launch planning.

Same quantization format as the other kernels (``Int4Weight``: g64/128/256, scales and integer
zero points per group); only the prepacked layout differs: K-major (all strips of one 64-k chunk
are contiguous, so the blocks that stream the same k range read one window of memory) and in the
natural k order of the ``mma.m16n8k16`` A fragment (so x is read with ``ldmatrix``, unpermuted).
Layout, pipeline and split-K are described at the top of ``w4a16_mtc.cu`` and in
docs/kernels_gpu.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from anvil_kernels.cuda.w4a16_tc import SMEM_PER_SM, STAGE_XROW_BYTES, TcPlan, choose_split
from anvil_kernels.format import Int4Weight

MTC_MAX_SPLIT = 32
WG_XROW_BYTES = 128  # x bytes per row in a wg stage (core matrices, no padding)
REGS_PER_SM = 65536


@dataclass(frozen=True)
class MtcConfig:
    """One block tile: BM = 8*mt*wm rows of x by BN = 16*ns*wn columns, 32*wm*wn threads, st
    pipeline stages of one 64-k chunk, ``minb`` blocks per SM asked of ptxas (launch bounds).
    ``regs``: ptxas's count on sm_90 (nvcc 13.0, bf16, g128; test_mtc_ptxas_report keeps it
    honest). ``sa``: scaled A (the A fragment is (q - z) * s rounded to the activations' type, one
    accumulator set) or exact (integers (q - z) on the tensor cores, the scale applied per group in
    fp32), as ``TcConfig``."""

    mt: int
    ns: int
    wm: int
    wn: int
    st: int
    regs: int
    sa: bool
    minb: int = 1
    wg: bool = False  # the wgmma kernel (w4a16_wg.cu, sm_90a): wm = 1, whole warpgroups, sa
    # warp-specialized wg (w4a16_wgs.cu), ws = the producer's warps: 1, or 4 (a warpgroup, whose
    # setmaxnreg gives the consumers 232 registers a thread); the producer copies (bulk copies,
    # mbarriers) from x retiled by w4a16_tile_x (``tile_x_rows``); the wn warps only dequantize
    # and multiply. 0: not warp-specialized
    ws: int = 0
    # wgd (w4a16_wgd.cu): dq = wn more warps dequantize (one strip each, ns = 1) into a ring of
    # ``ast`` A stages in shared memory, from which the wn warps' wgmmas read both operands; the
    # producer as in wgs (ws = 1). 0: the warps that multiply dequantize (wg, wgs)
    dq: int = 0
    ast: int = 0
    # kc = 2, 4 or 8 (a ws config, kc dividing ns * mt): the kc splits of a tile are one cluster
    # and sum their partials through distributed shared memory, no workspace (w4a16_wgs.cu); it runs
    # at split kc only. 0: split-K through the workspace, any split
    kc: int = 0
    # tx (a ws config without dq): the producer reads x through a TMA tensor map (128-byte swizzle,
    # rows past M zero-filled), the stage's x first and each stage rounded up to 1024 bytes; no
    # w4a16_tile_x launch before the kernel (w4a16_wgs.cu, WgsStage)
    tx: bool = False
    # ur (a ws config without dq, st a multiple of the group's chunks): the consumers' loop unrolled
    # over the ring's st stages, each chunk's stage, addresses and descriptor constants (w4a16_wgs.cu)
    ur: bool = False

    def __post_init__(self) -> None:
        if self.wg and (self.wm != 1 or self.wn % 4 or not self.sa or self.mt not in (4, 8, 16)):
            raise ValueError("a wg config has wm = 1, warpgroups of 4 warps, sa, and BM = 32, 64 or 128")
        if self.wg and not self.ws and self.mt < 8:
            # wg's cp.async copies take whole trips of whole 8-row groups (MtcLoader's assertion)
            raise ValueError("a wg config without a producer (ws = 0) has BM = 64 or 128")
        if self.ws and not self.wg:
            raise ValueError("a ws config is a wg config (the same math, its copies on a producer warp)")
        if self.ws not in (0, 1, 4):
            raise ValueError("ws: 0, a producer warp (1) or a producer warpgroup (4)")
        if self.dq and (self.ws != 1 or self.ns != 1 or self.dq != self.wn or self.ast < 2):
            raise ValueError("a wgd config (dq) has a producer warp, ns = 1, dq = wn and 2+ A stages")
        if self.ast and not self.dq:
            raise ValueError("A stages (ast) belong to a wgd config (dq)")
        quads = self.ns * self.mt  # a thread's accumulator quads, shared out among the cluster's ranks
        if self.kc not in (0, 2, 4, 8) or (self.kc and (not self.ws or self.dq or quads % self.kc)):
            raise ValueError("kc: 0, or 2, 4, 8 for a wgs config (ws, no dq) whose ns * mt it divides")
        if self.tx and (not self.ws or self.dq):
            raise ValueError("tx (x through a tensor map) is a wgs config's: ws, no dq")
        if self.ur and (not self.ws or self.dq or self.st % 4):
            raise ValueError(
                "ur (the loop unrolled over the ring) is a wgs config's whose st is a multiple of 4"
            )

    @property
    def bm(self) -> int:
        return 8 * self.mt * self.wm

    @property
    def bn(self) -> int:
        return 16 * self.ns * self.wn

    @property
    def consumers(self) -> int:
        """Threads that hold the tile's accumulators (the split-K partials' layout)."""
        return 32 * self.wm * self.wn

    @property
    def threads(self) -> int:
        return self.consumers + 32 * self.ws + 32 * self.dq

    @property
    def stage_bytes(self) -> int:
        strips = self.ns * self.wn
        return strips * 512 + strips * 64 + self.bm * (WG_XROW_BYTES if self.wg else STAGE_XROW_BYTES)

    @property
    def smem(self) -> int:
        # ws: a full and an empty mbarrier (8 bytes each) per stage after the stages; dq: the A
        # stages (bn columns x 64 k, 16-bit) before them, and their two mbarriers each
        a_stages = self.ast * (self.bn * 128 + 16)
        if self.tx:  # stages of whole 1024-byte swizzle atoms, and 1024 bytes to align the ring
            return self.st * -(-self.stage_bytes // 1024) * 1024 + 16 * self.st + 1024
        return self.st * self.stage_bytes + (16 * self.st if self.ws else 0) + a_stages

    @property
    def blocks_per_sm(self) -> int:
        by_regs = REGS_PER_SM // (max(self.regs, 1) * self.threads)
        return max(1, min(by_regs, SMEM_PER_SM // self.smem, 2048 // self.threads))


# name -> config (all 256 threads). Registers as reported by ptxas for sm_90 (bf16, g128).
MTC_CONFIGS: dict[str, MtcConfig] = {
    "mtc8": MtcConfig(mt=1, ns=2, wm=1, wn=8, st=8, regs=80, sa=False, minb=2),  # 8 x 256
    "mtc16": MtcConfig(mt=2, ns=2, wm=1, wn=8, st=8, regs=104, sa=False, minb=2),  # 16 x 256
    # 4 strips per warp: the per-chunk copy, barrier and scale work spread over twice the weights
    "mtc8x": MtcConfig(mt=1, ns=4, wm=1, wn=8, st=5, regs=120, sa=False, minb=2),  # 8 x 512
    "mtc16x": MtcConfig(mt=2, ns=4, wm=1, wn=8, st=5, regs=160, sa=False, minb=1),  # 16 x 512
    "mtc32": MtcConfig(mt=4, ns=2, wm=1, wn=8, st=6, regs=128, sa=False, minb=2),  # 32 x 256
    "mtc64": MtcConfig(mt=4, ns=2, wm=2, wn=4, st=5, regs=112, sa=True, minb=2),  # 64 x 128
    "mtc64w": MtcConfig(mt=4, ns=4, wm=2, wn=4, st=5, regs=168, sa=True, minb=1),  # 64 x 256
    "mtc128": MtcConfig(mt=8, ns=2, wm=2, wn=4, st=4, regs=184, sa=True, minb=1),  # 128 x 128
    "mtc128w": MtcConfig(mt=8, ns=4, wm=2, wn=4, st=4, regs=255, sa=True, minb=1),  # 128 x 256
    # wgmma (sm_90a only): every warp holds all BM rows, the warpgroup's 4 warps 64 columns a slice;
    # st - 2 chunks of copies in flight (one more stage holds the chunk in the tensor cores)
    "wg64": MtcConfig(mt=8, ns=2, wm=1, wn=8, st=5, regs=168, sa=True, minb=1, wg=True),  # 64 x 256
    "wg64n": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=6, regs=96, sa=True, minb=2, wg=True),  # 64 x 128
    # the unrolled epilogue takes most registers (at 128 it spills)
    "wg128": MtcConfig(mt=16, ns=1, wm=1, wn=8, st=5, regs=254, sa=True, minb=1, wg=True),  # 128 x 128
    "wg128w": MtcConfig(mt=16, ns=2, wm=1, wn=8, st=5, regs=255, sa=True, minb=1, wg=True),  # 128 x 256
    # deeper rings of the same tiles (issue #17, built, not yet measured): one block of 8 warps per
    # SM keeps st - 2 chunks of copies in flight, 51 KiB (wg64) / 77 KiB (wg128w) at st = 5;
    # 102 / 128 KiB here (136 / 175 KiB of shared memory)
    "wg64d": MtcConfig(mt=8, ns=2, wm=1, wn=8, st=8, regs=157, sa=True, minb=1, wg=True),  # 64 x 256
    "wg128wd": MtcConfig(mt=16, ns=2, wm=1, wn=8, st=7, regs=255, sa=True, minb=1, wg=True),  # 128 x 256
    # warp-specialized wg tiles (issue #17, twentieth session): 8 consumer warps and a producer
    # warp; no block-wide barrier in the loop, st - 1 chunks of copies in flight. 288 threads leave
    # ptxas 168 registers a thread: too few for a 128-row tile, hence wgs128w's producer warpgroup
    "wgs64": MtcConfig(mt=8, ns=2, wm=1, wn=8, st=8, regs=157, sa=True, minb=1, wg=True, ws=1),  # 64 x 256
    "wgs64n": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=6, regs=80, sa=True, minb=2, wg=True, ws=1),  # 64 x 128
    # deeper rings of the same two: 64 x 256 at 12 stages (209 KiB), 64 x 128 at 8 (100 KiB, still
    # two blocks a SM)
    "wgs64d": MtcConfig(mt=8, ns=2, wm=1, wn=8, st=12, regs=157, sa=True, minb=1, wg=True, ws=1),
    "wgs64nd": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=8, regs=80, sa=True, minb=2, wg=True, ws=1),
    # wgs64nd with its two splits in one cluster (split-K on chip, as wgs128wk): M = 64 at split 2
    "wgs64ndk2": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=8, regs=80, sa=True, minb=2, wg=True, ws=1, kc=2),
    # x through a TMA tensor map (tx, thirty-fourth session): no w4a16_tile_x launch before the tile
    # (1.9 µs alone at M = 64 of 8192², H100, thirty-third session). Faster than wgs64nd at every
    # shape and M = 64-256 on an H100 (thirty-fifth session)
    "wgs64ndt": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=8, regs=88, sa=True, minb=2, wg=True, ws=1, tx=True),
    # wgs64ndk2 with x through the tensor map and the consumers' loop unrolled over the ring (ur: each
    # chunk's stage, addresses and descriptor constants, 93 SASS instructions a chunk a warp against
    # 124): M = 64 of 8192² 24.4 µs against wgs64ndk2's 27.4 (H100, thirty-fifth session)
    "wgs64ndk2tu": MtcConfig(
        mt=8, ns=1, wm=1, wn=8, st=8, regs=88, sa=True, minb=2, wg=True, ws=1, kc=2, tx=True, ur=True
    ),
    # taken out after measuring on an H100 (thirty-fifth session; code in f7c0b9f): wgs64ndk4 (kc = 4,
    # never the fastest tile; on 14336 x 4096, its shape, slower than wgs64nd at split 4), wgs64ndk2t
    # and wgs64ndk2u (tx alone and ur alone, both slower than wgs64ndk2tu at every shape and M)
    # taken out after measuring on an H100 (thirty-third session, docs/kernels_gpu.md "A deeper ring
    # and more warps, measured"): wgs64nx (wgs64nd at 16 stages, one block a SM; fb3d27c) and wgs64q
    # (64 x 256, 16 consumer warps; c050702), both slower than wgs64nd at their best splits
    # 128 x 256 (wg128w's tile): a producer warpgroup hands its registers to the consumers
    # (setmaxnreg: 40 / 232; ptxas reports the launch's 168)
    "wgs128w": MtcConfig(mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, minb=1, wg=True, ws=4),
    # wgs128w with its two splits in one cluster, summed on chip (thirty-third session): the split-K
    # epilogue through the workspace took 10 µs (median block) of its 62 at M = 256, split 2 on an
    # H100 (thirty-second session's timeline)
    "wgs128wk": MtcConfig(mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, minb=1, wg=True, ws=4, kc=2),
    # both with x through a TMA tensor map (tx, thirty-fourth session): faster than wgs128w and
    # wgs128wk at every shape and M = 64-256 on an H100 (thirty-fifth session)
    "wgs128wt": MtcConfig(mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, minb=1, wg=True, ws=4, tx=True),
    "wgs128wkt": MtcConfig(
        mt=16, ns=2, wm=1, wn=8, st=6, regs=168, sa=True, minb=1, wg=True, ws=4, kc=2, tx=True
    ),
    # wgs128wk4 (the same at kc = 4, for N = 4096) measured slower than wgs128w at every shape and M
    # = 64-256 on an H100 (thirty-fourth session; code in 6dbf8f0) and was taken out
    # 32 rows (twenty-sixth session): wgmma m64n32k16. x reaches the tensor cores from the stage
    # once a warpgroup (the GEMV-like kernels read every x fragment once a warp, through L1); a
    # smaller accumulator leaves room for more blocks a SM. The fastest kernel at M = 32 on two of the
    # three large shapes (H100 and H200). Its 16-row siblings (wgs16: 16 x 128, 8 stages; wgs16w:
    # 16 x 256) lost to the GEMV-like kernels at 1-16 rows on both cards (22-27 µs against 14-19) and
    # were taken out in the twenty-eighth session (the code is in 9877a4f)
    "wgs32": MtcConfig(mt=4, ns=1, wm=1, wn=8, st=8, regs=64, sa=True, minb=3, wg=True, ws=1),
    # wgd (thirty-first session): wgs64nd's tile with 8 more warps that dequantize into shared
    # memory; the 8 that multiply read both wgmma operands from there. 17 warps are 5 warpgroups'
    # worth of registers: at most 96 a thread (a 128-row twin spilled there). Measured with one
    # arrival a thread and again with one a warp: slower than wgs64nd both times (H100, 38.0 and
    # 39.1 against 30.7 and 30.3 µs at M = 64 of 8192², thirty-first and thirty-second sessions)
    "wgd64": MtcConfig(mt=8, ns=1, wm=1, wn=8, st=8, regs=80, sa=True, minb=1, wg=True, ws=1, dq=8, ast=4),
}


def mtc_kernel_name(dtype: str, cfg_name: str, cpg: int) -> str:
    return f"w4a16{cfg_name}_{dtype}_c{cpg}"


def mtc_instantiation(dt_code: int, dtype: str, cfg_name: str, cpg: int) -> str:
    c = MTC_CONFIGS[cfg_name]
    name = mtc_kernel_name(dtype, cfg_name, cpg)
    if c.dq:
        args = f"{name}, {dt_code}, {c.mt}, {c.wn}, {c.st}, {c.ast}, {cpg}, {c.minb}"
        return f"ANVIL_W4A16_WGD_KERNEL({args})"
    if c.ws:
        args = f"{name}, {dt_code}, {c.mt}, {c.ns}, {c.wn}, {c.st}, {cpg}, {c.ws}, {c.minb}, {c.kc}"
        return f"ANVIL_W4A16_WGS_KERNEL({args}, {int(c.tx)}, {int(c.ur)})"
    if c.wg:
        args = f"{name}, {dt_code}, {c.mt}, {c.ns}, {c.wn}, {c.st}, {cpg}, {c.minb}"
        return f"ANVIL_W4A16_WG_KERNEL({args})"
    sa = "true" if c.sa else "false"
    args = f"{name}, {dt_code}, {c.mt}, {c.ns}, {c.wm}, {c.wn}, {c.st}, {cpg}, {sa}, {c.minb}"
    return f"ANVIL_W4A16_MTC_KERNEL({args})"


TILE_X_KERNEL = "w4a16_tile_x"
TILE_X_INSTANTIATION = "ANVIL_W4A16_TILE_X_KERNEL()"
TILE_X_THREADS = 256


def tile_x_rows(m: int, cfg_name: str) -> int:
    """Rows of the retiled x a ws config reads for M = m (whole tiles of BM rows; the rows past m
    are zero); 0 for any other config, and for a tx config (x through a tensor map, as it is)."""
    c = MTC_CONFIGS[cfg_name]
    return -(-m // c.bm) * c.bm if c.ws and not c.tx else 0


def plan_mtc(
    m: int, n: int, k: int, g: int, cfg_name: str, *, sm_count: int = 132, split: int | None = None
) -> TcPlan:
    """Geometry of one launch of mtc config ``cfg_name`` for (M, N, K) with groups of g: grid (M
    tiles, N tiles, split), as ``plan_tc`` (the same split-K protocol and workspace)."""
    if cfg_name not in MTC_CONFIGS:
        raise ValueError(f"unknown mtc config {cfg_name!r}; known: {sorted(MTC_CONFIGS)}")
    if n % 16 != 0 or k % g != 0 or g % 64 != 0:
        raise ValueError(f"N={n} must be a multiple of 16 and K={k} a multiple of g={g} (a multiple of 64)")
    c = MTC_CONFIGS[cfg_name]
    mtiles = -(-m // c.bm)
    ntiles = -(-n // c.bn)
    groups = k // g
    if c.kc and split not in (None, c.kc):
        raise ValueError(f"{cfg_name} sums its splits in a cluster of {c.kc}: split {c.kc} only, not {split}")
    if split is None:
        tiles = mtiles * ntiles
        split = c.kc or choose_split(tiles, groups, sm_count, c.blocks_per_sm, max_split=MTC_MAX_SPLIT)
    if not 1 <= split <= groups:
        raise ValueError(f"split={split} must be in [1, {groups}] (the groups along K)")
    ws = mtiles * ntiles * split * c.bm * c.bn if split > 1 and not c.kc else 0
    return TcPlan(cfg_name, (mtiles, ntiles, split), c.threads, c.smem, split, ws, mtiles * ntiles)


# ---------------------------------------------------------------------------------------------
# layout


def prepack_mtc(w: Int4Weight) -> dict[str, np.ndarray]:
    """Int4Weight -> the arrays ``w4a16_mtc.cu`` reads: ``mq`` uint32 (K/64, N/16, 32, 4), ``msz``
    uint32 (K/g, N/16, 8, 2) and ``meta`` [K, N, g, scale kind], as ``prepack`` (same checks, same
    scale/zero words, fp32 scales rounded to bf16); ``unprepack_mtc`` is the inverse.

    mq[kc, strip, lane, step], nibble p (bits 4p..4p+3), j = p & 3, e = p >> 2:
        n = 16 strip + (lane >> 2) + 8 (j & 1),  k = 64 kc + 16 step + 2 (lane & 3) + e + 8 (j >> 1)
    """
    from anvil_kernels.cuda.w4a16 import _check_prepackable, sz_words
    from anvil_kernels.format import unpack_nibbles

    _check_prepackable(w)
    k, n, g = w.k, w.n, w.group_size
    q = unpack_nibbles(w.packed)  # (K, N)
    # k = 64 kc + 16 s + 8 jhi + 2 t4 + e ; n = 16 strip + 8 jlo + g8
    q8 = q.reshape(k // 64, 4, 2, 4, 2, n // 16, 2, 8)
    # -> (kc, strip, g8, t4, s, e, jhi, jlo): lane = 4 g8 + t4, word = s, nibble = 4 e + 2 jhi + jlo
    qt = q8.transpose(0, 5, 7, 3, 1, 4, 2, 6).reshape(k // 64, n // 16, 32, 4, 8)
    # nibbles 2i, 2i+1 -> byte i; four little-endian bytes -> the word (nibble p at bits 4p)
    pairs = np.ascontiguousarray(qt[..., 0::2] | (qt[..., 1::2] << np.uint8(4)))
    words = pairs.view("<u4").reshape(qt.shape[:-1]).astype(np.uint32)
    word_sz, kind = sz_words(w)  # (G, N)
    msz = np.ascontiguousarray(word_sz.reshape(k // g, n // 16, 2, 8).transpose(0, 1, 3, 2))
    return {"mq": words, "msz": msz, "meta": np.array([k, n, g, kind], np.int64)}


def unprepack_mtc(packed: Mapping[str, np.ndarray]) -> Int4Weight:
    """Inverse of ``prepack_mtc`` (fp32 scales come back as bf16)."""
    from anvil_kernels.cuda.w4a16 import int4_from_words

    k, n, g, kind = (int(v) for v in packed["meta"])
    words = packed["mq"]
    nib = np.empty((*words.shape, 8), np.uint8)
    for p in range(8):
        nib[..., p] = (words >> np.uint32(4 * p)) & np.uint32(15)
    # (kc, strip, g8, t4, s, e, jhi, jlo) -> (kc, s, jhi, t4, e, strip, jlo, g8)
    nib8 = nib.reshape(k // 64, n // 16, 8, 4, 4, 2, 2, 2)
    q = np.ascontiguousarray(nib8.transpose(0, 4, 6, 3, 5, 1, 7, 2)).reshape(k, n)
    word_sz = packed["msz"].transpose(0, 1, 3, 2).reshape(k // g, n)
    return int4_from_words(q, word_sz, g, kind)


def mtc_from_prepack(packed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The mtc arrays of a layer given ``prepack``'s output (the GEMV layout): converted on the
    host (a permutation, no rounding), or taken as they are when ``packed`` already holds them."""
    if "mq" in packed and "msz" in packed:
        return {"mq": packed["mq"], "msz": packed["msz"], "meta": packed["meta"]}
    from anvil_kernels.cuda.w4a16 import unprepack

    return prepack_mtc(unprepack(packed))
