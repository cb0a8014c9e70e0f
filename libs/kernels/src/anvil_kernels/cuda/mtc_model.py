"""A numpy model of ``w4a16_mtc.cu``: every thread's cp.async copies into the pipeline stages (the
``MtcLoader`` pieces, zero-fill past N and past M, sz only with a group's first chunk), every lane's
A words from shared memory and their dequantization (the shifts and masks of ``mtc_pair``), the
``ldmatrix.x4`` of x (which lane supplies which row address, which lane receives which elements),
the ``mma.m16n8k16`` fragments through the PTX ISA layouts, the split-K partials in fragment order
and the epilogue's (m, n) mapping, in float64.

The names match the .cu, so a CPU test can check that ``prepack_mtc``'s layout, the stage layout
and the fragment ownership reconstruct x @ W before any GPU runs it (``simulate``). It models no
timing: the cp.async ring is replayed in program order and each read checks that its stage holds
the chunk (and the group's scales) it expects.

ldmatrix (m8n8, .x4, 16-bit): lanes 8j .. 8j+7 give the row addresses of matrix j (16 bytes each);
lane T receives in register j the elements 2 (T & 3) and 2 (T & 3) + 1 of row T >> 2 of matrix j.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from numpy.typing import NDArray

from anvil_kernels.cuda.tc_model import (
    _G8,
    _LANES,
    _T4,
    _a_index,
    _b_index,
    _c_index,
    _scale_f,
    round_a,
    stage_x,
)
from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS, WG_XROW_BYTES
from anvil_kernels.cuda.w4a16_tc import STAGE_XROW_BYTES

XROW = STAGE_XROW_BYTES


def ldmatrix_x4(stage_x: NDArray[np.float64], addr: NDArray[np.int64]) -> NDArray[np.float64]:
    """ldmatrix.x4 on a stage's x bytes (as 2-byte elements): addr (32,) byte addresses, one per
    lane (lane 8j + r: row r of matrix j). Returns (4 registers, 32 lanes, 2 elements)."""
    assert addr.shape == (32,) and not np.any(addr % 16), "ldmatrix rows are 16-byte aligned"
    rows = stage_x[(addr // 2)[:, None] + np.arange(8)]  # (32 row addresses, 8 elements)
    out = np.empty((4, 32, 2))
    for j in range(4):
        mat = rows[8 * j : 8 * j + 8]  # matrix j: 8 rows x 8 elements
        for e in range(2):
            out[j, :, e] = mat[_LANES >> 2, 2 * (_LANES & 3) + e]
    return out


def stage_x_wg(
    stage: NDArray[np.float64], x: NDArray[np.float64], chunk: int, BM: int, m0: int, m_rows: int
) -> None:
    """``stage_x`` for a wg config: piece (row r, 16-byte piece p) at x_off(r, p) = (r >> 3) * 1024
    + p * 128 + (r & 7) * 16 bytes (8-row x 16-byte core matrices), zeros past M."""
    _stage_pieces(stage, x, chunk, BM, m0, m_rows, lambda r, p: (r >> 3) * 1024 + p * 128 + (r & 7) * 16)


def stage_x_sw128(
    stage: NDArray[np.float64], x: NDArray[np.float64], chunk: int, BM: int, m0: int, m_rows: int
) -> None:
    """A tx config's x tile as its producer's TMA box writes it (tmap.encode_x: 64 values x BM rows,
    128-byte swizzle): row r's 16-byte piece p at r * 128 + (p ^ (r & 7)) * 16 bytes, zeros past M
    (the copy's out-of-bounds fill)."""
    _stage_pieces(stage, x, chunk, BM, m0, m_rows, lambda r, p: r * 128 + (p ^ (r & 7)) * 16)


def _stage_pieces(
    stage: NDArray[np.float64],
    x: NDArray[np.float64],
    chunk: int,
    BM: int,
    m0: int,
    m_rows: int,
    offset: Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64]],
) -> None:
    """Chunk ``chunk``'s x rows m0 .. m0 + BM - 1 into a stage, 16-byte piece p of row r at byte
    offset(r, p), zeros past M."""
    p = np.arange(BM * 8)
    r, piece = p >> 3, p & 7
    m = m0 + r
    ok = m < m_rows
    dst = offset(r, piece) // 2
    kk = chunk * 64 + piece * 8
    vals = x[np.where(ok, m, 0)[:, None], kk[:, None] + np.arange(8)]
    stage[dst[:, None] + np.arange(8)] = np.where(ok[:, None], vals, 0.0)


def wgmma_b_sw128(stage_x: NDArray[np.float64], start: int, n: int) -> NDArray[np.float64]:
    """B (16 k x n columns) of wgmma from a K-major descriptor with the 128-byte swizzle (bytes; the
    tile 1024-byte aligned, SBO 1024): element (k, col) at the address start + col * 128 + 2 k with
    its bits 4-6 exclusive-ored with bits 7-9 (the row within the 8-row group)."""
    k = np.arange(16)[:, None]
    col = np.arange(n)[None, :]
    addr = start + (col >> 3) * 1024 + (col & 7) * 128 + k * 2
    addr = addr ^ (((addr >> 7) & 7) << 4)
    return stage_x[addr // 2]


def tile_x(x: NDArray[np.float64], mpad: int) -> NDArray[np.float64]:
    """What ``w4a16_tile_x`` writes for a wgs config: x (M, K) as [K/64 chunks][mpad/8 row groups]
    [8 k pieces][8 rows][8 values], flat, rows M .. mpad - 1 zero; so the stage of (chunk c, rows
    m0 .. m0 + BM) is the contiguous slice from (c * mpad + m0) * 64, in ``stage_x_wg``'s order."""
    m, k = x.shape
    assert mpad % 8 == 0 and mpad >= m and k % 64 == 0
    xp = np.zeros((mpad, k))
    xp[:m] = x
    return xp.reshape(mpad // 8, 8, k // 64, 8, 8).transpose(2, 0, 3, 1, 4).reshape(-1)


def untile_x(xt: NDArray[np.float64], m: int, k: int, mpad: int) -> NDArray[np.float64]:
    """The inverse of ``tile_x`` (the first m rows)."""
    return xt[: mpad * k].reshape(k // 64, mpad // 8, 8, 8, 8).transpose(1, 3, 0, 2, 4).reshape(mpad, k)[:m]


def wgmma_b(stage_x: NDArray[np.float64], start: int, lbo: int, sbo: int, n: int) -> NDArray[np.float64]:
    """B (16 k x n columns) of wgmma from a no-swizzle K-major descriptor (bytes): element (k, col)
    at start + (col >> 3) * sbo + (k >> 3) * lbo + (col & 7) * 16 + (k & 7) * 2."""
    k = np.arange(16)[:, None]
    col = np.arange(n)[None, :]
    addr = start + (col >> 3) * sbo + (k >> 3) * lbo + (col & 7) * 16 + (k & 7) * 2
    return stage_x[addr // 2]


def _issue(
    stages: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    buf: int,
    c: int,
    geo: tuple[int, ...],
    W: np.ndarray,
    SZ: np.ndarray,
    x: np.ndarray,
) -> None:
    """MtcLoader::issue of chunk c into stage buf: thread tid copies pieces tid + it*NT, so
    together the threads copy every piece once (vectorized over pieces). Zero-fill (src-size 0)
    past N and past M; sz only when c starts a group (the stage keeps its old sz otherwise)."""
    stW, stSZ, stX, held, held_g = stages
    BS, BM, CPG, strips, strip0, m0, m_rows, wg = geo
    p = np.arange(BS * 32)
    ok = strip0 + (p >> 5) < strips
    src = np.where(ok, (c * strips + strip0) * 32 + p, 0)
    stW[buf] = np.where(ok[:, None], W[src], 0)
    if c % CPG == 0:
        t = np.arange(BS * 4)
        ok = strip0 + (t >> 2) < strips
        src = np.where(ok, ((c // CPG) * strips + strip0) * 4 + t, 0)
        stSZ[buf] = np.where(ok[:, None], SZ[src], 0)
        held_g[buf] = c // CPG
    else:
        held_g[buf] = -1  # this stage's sz is stale: reading it would be a bug
    (stage_x_wg if wg else stage_x)(stX[buf], x, c, BM, m0, m_rows)
    held[buf] = c


def simulate(
    packed: Mapping[str, np.ndarray],
    x: NDArray[np.float64],
    cfg_name: str,
    split: int,
    dtype: str = "bf16",
    xt: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Run the kernel's data movement and math for x (M, K) on ``prepack_mtc`` output; returns
    (out (M, N) float64, NaN where never written; writes (M, N): how many times the epilogue
    wrote each element). ``dtype`` sets the rounding of the scaled A fragments of an ``sa``
    config (``round_a``); exact configs ignore it. A wgs config (``ws``) reads its stages' x from
    ``xt`` (``tile_x``'s layout, what the launcher's ``w4a16_tile_x`` wrote; made from x when None)
    at the producer's offsets, one contiguous slice a chunk (a tx config's copies read x itself,
    ``stage_x_sw128``, and its wgmmas through the swizzled descriptor); its ring is modelled as wg's."""
    c = MTC_CONFIGS[cfg_name]
    k, n, g, kind = (int(v) for v in packed["meta"])
    m_rows = x.shape[0]
    W = packed["mq"].reshape(-1, 4)  # uint4 view: (chunk, strip, lane) flattened
    SZ = packed["msz"].reshape(-1, 4)  # uint4 view: (group, strip, 16 B piece) flattened
    BM, BS, NT, MT, NS, WN, ST = c.bm, c.ns * c.wn, c.consumers, c.mt, c.ns, c.wn, c.st
    strips, KC = n >> 4, k >> 6
    CPG = g // 64
    G = KC // CPG
    S = split
    mtiles, ntiles = -(-m_rows // BM), -(-n // (16 * BS))
    out = np.full((m_rows, n), np.nan)
    writes = np.zeros((m_rows, n), np.int64)
    REGS = NS * MT * 4
    nwarps = NT // 32
    xrow = WG_XROW_BYTES if c.wg else XROW
    mpad = mtiles * BM
    if c.ws and not c.tx and xt is None:
        xt = tile_x(x, mpad)

    Stages = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

    def issue(stages: Stages, buf: int, chunk: int, geo: tuple[int, ...], m0: int) -> None:
        _issue(stages, buf, chunk, geo, W, SZ, x)
        if c.tx:  # the producer's tensor copy of x: one box, swizzled, straight from x
            stage_x_sw128(stages[2][buf], x, chunk, BM, m0, m_rows)
        elif c.ws:  # the producer's bulk copy of x: BM/8 x 1024 bytes from XT + (chunk * mpad + m0) * 64
            assert xt is not None
            start = (chunk * mpad + m0) * 64
            stages[2][buf] = xt[start : start + BM * 64]

    for bx in range(mtiles):
        for by in range(ntiles):
            m0, strip0 = bx * BM, by * BS
            ws = np.full((S, REGS, NT), np.nan)
            for z in range(S):
                gb, ge = (G * z) // S, (G * (z + 1)) // S
                c0, nck = gb * CPG, (ge - gb) * CPG
                stW = np.zeros((ST, BS * 32, 4), np.uint32)
                stSZ = np.zeros((ST, BS * 4, 4), np.uint32)
                stX = np.full((ST, BM * xrow // 2), np.nan)  # padding never written: NaN
                held, held_g = np.full(ST, -1), np.full(ST, -1)
                stages = (stW, stSZ, stX, held, held_g)
                geo = (BS, BM, CPG, strips, strip0, m0, m_rows, c.wg)
                # chunks of copies in flight: ST - 1, and ST - 2 for wg (whose chunk i - 1 may still
                # be in the tensor cores while chunk i is dequantized: its stage is not refilled yet)
                PF = ST - 2 if c.wg else ST - 1
                for s in range(PF):
                    if s < nck:
                        issue(stages, s, c0 + s, geo, m0)
                acc = np.zeros((nwarps, NS, MT, 4, 32))
                cg = np.zeros_like(acc)
                slo = np.zeros((nwarps, NS, 32))
                shi, zlo, zhi = np.zeros_like(slo), np.zeros_like(slo), np.zeros_like(slo)
                rd, wr = 0, PF
                for i in range(nck):
                    if i + PF < nck:
                        # never the stage of a chunk whose wgmmas may be pending (wg: i - 1, i)
                        busy = c0 + i - (1 if c.wg else 0)  # the oldest chunk still being read
                        assert held[wr] < 0 or held[wr] < busy, f"stage {wr} holds chunk {held[wr]}, in use"
                        issue(stages, wr, c0 + i + PF, geo, m0)
                    buf = rd
                    rd, wr = (rd + 1) % ST, (wr + 1) % ST
                    assert held[buf] == c0 + i, f"stage {buf} holds chunk {held[buf]}, not {c0 + i}"
                    cc = i % CPG
                    sWw = stW[buf].reshape(-1, 4)
                    sSZw = stSZ[buf].reshape(-1)
                    for warp in range(nwarps):
                        wm, wn = warp // WN, warp % WN
                        if cc == 0:
                            assert held_g[buf] == (c0 + i) // CPG, "scales read from a stale stage"
                            for j in range(NS):
                                idx = (wn * NS + j) * 8 + _G8  # uint2 index
                                vx, vy = sSZw[2 * idx], sSZw[2 * idx + 1]
                                slo[warp, j], shi[warp, j] = _scale_f(vx, kind), _scale_f(vy, kind)
                                zlo[warp, j], zhi[warp, j] = vx >> np.uint32(16), vy >> np.uint32(16)
                            cg[warp] = 0.0
                        wv = [sWw[(wn * NS + j) * 32 + _LANES] for j in range(NS)]  # (32, 4) each
                        ldsm_off = (wm * MT * 8 + (_LANES & 7)) * XROW + (_LANES >> 3) * 16
                        for h in range(2):
                            if not c.wg:
                                b = [
                                    ldmatrix_x4(stX[buf], ldsm_off + mt * 8 * XROW + h * 64)
                                    for mt in range(MT)
                                ]
                            for ss in range(2):
                                s = 2 * h + ss
                                for j in range(NS):
                                    wd = wv[j][:, s]
                                    A = np.full((16, 16), np.nan)
                                    for r in range(4):
                                        v = wd >> np.uint32(4 * r)
                                        zz = zlo if r % 2 == 0 else zhi
                                        for e in range(2):
                                            q = (v >> np.uint32(16 * e)) & np.uint32(15)
                                            a = q.astype(np.float64) - zz[warp, j]
                                            if c.sa:  # (q - z) * s, the scale and the product rounded
                                                sr = (slo if r % 2 == 0 else shi)[warp, j]
                                                a = round_a(a * round_a(sr, dtype), dtype)
                                            A[_a_index(r, e)] = a
                                    if c.wg:  # this warp's 16 rows of D = A . B (16 k x BM rows of x)
                                        if c.tx:  # step s 32 bytes further (wg_desc_sw)
                                            Bw = wgmma_b_sw128(stX[buf], s * 32, BM)
                                        else:
                                            Bw = wgmma_b(stX[buf], s * 256, 128, 1024, BM)
                                        assert not np.isnan(A).any() and not np.isnan(Bw).any()
                                        D = A @ Bw
                                        for mt in range(MT):
                                            for qq in range(4):
                                                rr, cc_ = _c_index(qq)
                                                acc[warp, j, mt, qq] += D[rr, 8 * mt + cc_]
                                        continue
                                    for mt in range(MT):
                                        B = np.full((16, 8), np.nan)
                                        for r in range(2):
                                            for e in range(2):
                                                B[_b_index(r, e)] = b[mt][2 * ss + r][:, e]
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
            if c.kc:  # split-K in a cluster: the quads' partials through the owners' stages
                assert c.kc == S, f"{cfg_name} runs at split {c.kc} only"
                total, owner = _cluster_sum(ws, c.kc, NS, MT, NT, ST * c.stage_bytes)
            else:
                total = ws[0].copy()  # the last block of the tile adds the S partials in z order
                for z in range(1, S):
                    total += ws[z]
                owner = None
            assert not np.isnan(total).any(), "a split left its partials unwritten"
            acc_t = total.reshape(NS, MT, 4, nwarps, 32)
            for warp in range(nwarps):
                wm, wn = warp // WN, warp % WN
                for j in range(NS):
                    strip = strip0 + wn * NS + j
                    if strip >= strips:
                        continue
                    for qq in range(4):
                        nn = strip * 16 + _G8 + 8 * (qq >> 1)
                        for mt in range(MT):
                            if owner is not None and owner[j * MT + mt] < 0:
                                continue  # no rank finished this quad (owner: the rank that did)
                            mm = m0 + (wm * MT + mt) * 8 + 2 * _T4 + (qq & 1)
                            ok = mm < m_rows
                            out[mm[ok], nn[ok]] = acc_t[j, mt, qq, warp][ok]
                            np.add.at(writes, (mm[ok], nn[ok]), 1)
    return out, writes


def _cluster_sum(
    ws: NDArray[np.float64], kc: int, ns: int, mt_: int, nt: int, ring_bytes: int
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """w4a16_wgs.cu's split-K in a cluster of kc CTAs (the splits' partials ws (kc, REGS, NT) in
    fragment order): rank r stores each quad q = j * MT + mt it does not own into the stages of its
    owner q % kc at float4 [slot][q / kc][thread], slot = r < owner ? r : r - 1 (each slot written
    once, inside the ring); each owner adds the kc partials of its quads in z order, its own from
    its registers. Returns the sums (REGS, NT) and, per quad, the rank that finished it."""
    qk = ns * mt_ // kc
    size = (kc - 1) * qk * nt * 4  # floats

    def floats(slot: int, q: int) -> NDArray[np.int64]:  # slot's float4s of quad q, a thread's 4 in a row
        f4 = (slot * qk + q // kc) * nt + np.arange(nt)
        return (4 * f4[:, None] + np.arange(4)[None, :]).reshape(-1)

    assert size * 4 <= ring_bytes, "the peers' partials overflow the ring"
    smem = np.full((kc, size), np.nan)
    for rank in range(kc):
        for q in range(ns * mt_):
            o = q % kc
            if o == rank:
                continue
            dst = floats(rank if rank < o else rank - 1, q)
            assert np.isnan(smem[o, dst]).all(), "a slot written twice"
            smem[o, dst] = ws[rank, 4 * q : 4 * q + 4].T.reshape(-1)
    total = np.full(ws.shape[1:], np.nan)
    owner = np.full(ns * mt_, -1, np.int64)
    for o in range(kc):
        for q in range(ns * mt_):
            if q % kc != o:
                continue
            t = np.zeros((4, nt))
            for z in range(kc):
                if z == o:
                    p = ws[o, 4 * q : 4 * q + 4]
                else:
                    p = smem[o, floats(z if z < o else z - 1, q)].reshape(nt, 4).T
                t = t + p
            total[4 * q : 4 * q + 4] = t
            owner[q] = o
    return total, owner
