"""A numpy model of ``w4a16_tc.cu``: every thread's copies into the pipeline stages, every lane's
fragments through the PTX ISA layouts of ``mma.m16n8k16`` (A row-major, B column-major, C), the
split-K partials in fragment order and the epilogue's (m, n) mapping, in float64.

It mirrors the kernel's index arithmetic line by line (the names match the .cu), so a CPU test can
check that the prepack layout, the stage layout and the fragment ownership reconstruct x @ W
exactly before any GPU runs it (``simulate``). It models no timing: the cp.async ring is replayed
in program order, and each read checks that its stage holds the chunk it expects.

PTX fragment layouts used (m16n8k16, 16-bit inputs; g8 = lane >> 2, t4 = lane & 3; a register holds
two elements, the lower-indexed one in the low 16 bits):
    A (16 x 16): reg r, element e -> row g8 + 8 (r & 1), col 2 t4 + e + 8 (r >> 1)
    B (16 x 8):  reg r, element e -> row 2 t4 + e + 8 r, col g8
    C (16 x 8):  c[q]             -> row g8 + 8 (q >> 1), col 2 t4 + (q & 1)
In the kernel's formulation A = dequantized weights (rows = 16 output columns n, cols = 16 k),
B = x^T (16 k x 8 rows m of x), C = out^T.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from anvil_kernels.cuda.w4a16 import SCALE_BF16
from anvil_kernels.cuda.w4a16_tc import STAGE_XROW_BYTES, TC_CONFIGS
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

_LANES = np.arange(32)
_G8, _T4 = _LANES >> 2, _LANES & 3


def _a_index(r: int, e: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    return _G8 + 8 * (r & 1), 2 * _T4 + e + 8 * (r >> 1)


def _b_index(r: int, e: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    return 2 * _T4 + e + 8 * r, _G8


def _c_index(q: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    return _G8 + 8 * (q >> 1), 2 * _T4 + (q & 1)


def round_a(v: NDArray[np.float64], dtype: str) -> NDArray[np.float64]:
    """float64 -> the nearest bf16 / fp16 value (round to nearest even), as float64: what
    cvt.rn and mul.rn.{bf16,f16}x2 produce from an exact value."""
    if dtype == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(v, np.float32))).astype(np.float64)
    return np.asarray(v, np.float64).astype(np.float16).astype(np.float64)


def _scale_f(bits: NDArray[np.uint32], kind: int) -> NDArray[np.float64]:
    b16 = (bits & np.uint32(0xFFFF)).astype(np.uint16)
    if kind == SCALE_BF16:
        return bf16_bits_to_f32(b16).astype(np.float64)
    return b16.view(np.float16).astype(np.float64)


def _load(
    stages: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    buf: int,
    chunk: int,
    geo: tuple[int, ...],
    W: np.ndarray,
    SZ: np.ndarray,
    x: np.ndarray,
) -> None:
    """tc_load_stage: the cp.async copies of chunk ``chunk`` into stage ``buf``. Thread tid copies
    pieces tid, tid + NT, ..., so together the threads copy every piece once: vectorized over
    pieces. Zero-fill (src-size 0) past N and past M."""
    stW, stSZ, stX, held = stages
    BS, BM, CPG, KC, G, strips, strip0, m0, m_rows = geo
    grp = chunk // CPG
    p = np.arange(BS * 32)
    strip = strip0 + (p >> 5)
    ok = strip < strips
    src = np.where(ok, (strip * KC + chunk) * 32 + (p & 31), 0)
    stW[buf] = np.where(ok[:, None], W[src], 0)
    t = np.arange(BS * 4)  # one piece per thread tid < BS * 4
    strip = strip0 + (t >> 2)
    ok = strip < strips
    src = np.where(ok, (strip * G + grp) * 4 + (t & 3), 0)
    stSZ[buf] = np.where(ok[:, None], SZ[src], 0)
    stage_x(stX[buf], x, chunk, BM, m0, m_rows)
    held[buf] = chunk


def stage_x(
    stage: NDArray[np.float64], x: NDArray[np.float64], chunk: int, BM: int, m0: int, m_rows: int
) -> None:
    """The X tile of k-chunk ``chunk`` (64 columns of rows m0..m0+BM) into one stage, as the kernels'
    16-byte cp.async pieces lay it (rows STAGE_XROW_BYTES apart), zeros past M (tc and mtc share it)."""
    p = np.arange(BM * 8)
    r = p >> 3
    m = m0 + r
    ok = m < m_rows
    dst = (r * STAGE_XROW_BYTES + (p & 7) * 16) // 2  # element (2-byte) offset in the stage
    kk = chunk * 64 + (p & 7) * 8
    vals = x[np.where(ok, m, 0)[:, None], kk[:, None] + np.arange(8)]
    stage[dst[:, None] + np.arange(8)] = np.where(ok[:, None], vals, 0.0)


def simulate(
    packed: Mapping[str, np.ndarray],
    x: NDArray[np.float64],
    cfg_name: str,
    split: int,
    dtype: str = "bf16",
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Run the kernel's data movement and math for x (M, K) on ``prepack`` output; returns
    (out (M, N) float64, NaN where never written; writes (M, N): how many times the epilogue
    wrote each element). ``dtype``: the activations' type, which sets the rounding of the
    scaled A fragments of an ``sa`` config (``round_a``); exact configs ignore it."""
    c = TC_CONFIGS[cfg_name]
    k, n, g, kind = (int(v) for v in packed["meta"])
    m_rows = x.shape[0]
    W = packed["qweight"].reshape(-1, 4)  # uint4 view: (strip, chunk, lane) flattened
    SZ = packed["sz"].reshape(-1, 4)  # uint4 view: (strip, group, 16 B piece) flattened
    BM, BS, NT, MT, NS, WN, ST = c.bm, c.ns * c.wn, c.threads, c.mt, c.ns, c.wn, c.st
    XROW = STAGE_XROW_BYTES
    strips, KC = n >> 4, k >> 6
    CPG = g // 64
    G = KC // CPG
    S = split
    mtiles, ntiles = -(-m_rows // BM), -(-n // (16 * BS))
    out = np.full((m_rows, n), np.nan)
    writes = np.zeros((m_rows, n), np.int64)
    REGS = NS * MT * 4

    for bx in range(mtiles):
        for by in range(ntiles):
            m0, strip0 = bx * BM, by * BS
            ws = np.full((S, REGS, NT), np.nan)
            for z in range(S):
                gb, ge = (G * z) // S, (G * (z + 1)) // S
                c0, nck = gb * CPG, (ge - gb) * CPG
                stW = np.zeros((ST, BS * 32, 4), np.uint32)
                stSZ = np.zeros((ST, BS * 4, 4), np.uint32)
                stX = np.zeros((ST, BM * XROW // 2))
                held = np.full(ST, -1)
                stages = (stW, stSZ, stX, held)
                geo = (BS, BM, CPG, KC, G, strips, strip0, m0, m_rows)

                for s in range(ST - 1):
                    if s < nck:
                        _load(stages, s, c0 + s, geo, W, SZ, x)
                acc = np.zeros((NT // 32, NS, MT, 4, 32))
                cg = np.zeros_like(acc)
                slo = np.zeros((NT // 32, NS, 32))
                shi = np.zeros_like(slo)
                zlo = np.zeros_like(slo)
                zhi = np.zeros_like(slo)
                for i in range(nck):
                    nx = i + ST - 1
                    if nx < nck:
                        _load(stages, nx % ST, c0 + nx, geo, W, SZ, x)
                    buf = i % ST
                    # the stage read below must hold chunk i (ring indices), and the load just
                    # issued must not have overwritten it
                    assert held[buf] == c0 + i, f"stage {buf} holds chunk {held[buf]}, not {c0 + i}"
                    cc = i % CPG
                    sWw = stW[buf].reshape(-1)
                    sSZw = stSZ[buf].reshape(-1)
                    for warp in range(NT // 32):
                        wm, wn = warp // WN, warp % WN
                        if cc == 0:
                            for j in range(NS):
                                idx = (wn * NS + j) * 8 + _G8  # uint2 index
                                vx, vy = sSZw[2 * idx], sSZw[2 * idx + 1]
                                slo[warp, j], shi[warp, j] = _scale_f(vx, kind), _scale_f(vy, kind)
                                zlo[warp, j], zhi[warp, j] = vx >> np.uint32(16), vy >> np.uint32(16)
                            cg[warp] = 0.0
                        for s in range(4):
                            sh = (s & 1) * 4
                            for j in range(NS):
                                wv = sWw.reshape(-1, 4)[(wn * NS + j) * 32 + _LANES]  # (32, 4)
                                wa, wb = (wv[:, 0], wv[:, 1]) if s < 2 else (wv[:, 2], wv[:, 3])
                                A = np.full((16, 16), np.nan)
                                for r, (word, shift, zz) in enumerate(
                                    [(wa, sh, zlo), (wa, sh + 8, zhi), (wb, sh, zlo), (wb, sh + 8, zhi)]
                                ):
                                    for e in range(2):
                                        q = (word >> np.uint32(shift + 16 * e)) & np.uint32(15)
                                        a = q.astype(np.float64) - zz[warp, j]
                                        if c.sa:  # (q - z) * s, the scale and product rounded
                                            sr = (slo if r % 2 == 0 else shi)[warp, j]
                                            a = round_a(a * round_a(sr, dtype), dtype)
                                        A[_a_index(r, e)] = a
                                for mt in range(MT):
                                    row = (wm * MT + mt) * 8 + _G8
                                    base = (row * XROW + _T4 * 32) // 2  # 16 elements: xa, xb
                                    xs = stX[buf][base[:, None] + np.arange(16)]  # (32, 16)
                                    B = np.full((16, 8), np.nan)
                                    for r in range(2):
                                        for e in range(2):
                                            B[_b_index(r, e)] = xs[:, 4 * s + 2 * r + e]
                                    assert not np.isnan(A).any() and not np.isnan(B).any()
                                    C = A @ B
                                    for qq in range(4):
                                        (acc if c.sa else cg)[warp, j, mt, qq] += C[_c_index(qq)]
                        if not c.sa and cc == CPG - 1:
                            for j in range(NS):
                                sc = np.stack([slo[warp, j], slo[warp, j], shi[warp, j], shi[warp, j]])
                                acc[warp, j] += sc[None] * cg[warp, j]
                # partials in fragment order: ws[z][(j*MT + mt)*4 + q][tid]
                ws[z] = acc.transpose(1, 2, 3, 0, 4).reshape(REGS, NT)
            # the last block of the tile to arrive adds the S partials in z order
            total = ws[0].copy()
            for z in range(1, S):
                total += ws[z]
            assert not np.isnan(total).any(), "a split left its partials unwritten"
            acc_t = total.reshape(NS, MT, 4, NT // 32, 32)
            for warp in range(NT // 32):
                wm, wn = warp // WN, warp % WN
                for j in range(NS):
                    strip = strip0 + wn * NS + j
                    if strip >= strips:
                        continue
                    for qq in range(4):
                        nn = strip * 16 + _G8 + 8 * (qq >> 1)
                        for mt in range(MT):
                            mm = m0 + (wm * MT + mt) * 8 + 2 * _T4 + (qq & 1)
                            ok = mm < m_rows
                            out[mm[ok], nn[ok]] = acc_t[j, mt, qq, warp][ok]
                            np.add.at(writes, (mm[ok], nn[ok]), 1)
    return out, writes
