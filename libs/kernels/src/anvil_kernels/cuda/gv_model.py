"""A numpy model of ``w4a16_gv.cu`` (the GEMV-like kernel's shared-memory ring configs): one block's
dynamic shared memory as bytes (mbarriers, the warps' rings, the split-K reduction, sized as the
launch passes it), every copy a warp's loader makes into its ring (cp.async: each lane its own 16
bytes of each chunk, lanes 0..4*groups-1 the scale words; bulk: one contiguous copy of the stage's
weights and one of its scale words), replayed in the kernel's program order (prologue, then per
stage: wait, read, refill with stage + NST), and every lane's reads of its weight words and scale
words from the ring. The words read give the output through the layout of w4a16.cu's header
(k = 64 kc + 16 (lane & 3) + 4 s + 2 h + e, n = 16 strip + (lane >> 2) + 8 rowhi), in float64.

What it checks (``simulate`` raises AssertionError): every copy lands inside its warp's ring, a
stage is read only while the ring slot holds it (the slot's last fill was that stage, and for
bulk copies the mbarrier phase waited on is the slot's fill count - 1), each warp reads each chunk
and group of its K slice once, in order, and every output the block owns is written. The
``mma.m16n8k16`` fragment math is the register kernel's, checked by test_cuda_w4a16's
``test_fragment_emulation_matches_reference``; no timing is modelled.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from anvil_kernels.cuda.tc_model import _scale_f
from anvil_kernels.cuda.w4a16_gv import GV_CONFIGS

# nibble p of word wi of lane -> (n within the strip, k within the chunk), w4a16.cu's header
_LANE, _WI, _P = np.meshgrid(np.arange(32), np.arange(4), np.arange(8), indexing="ij")
_N_LOCAL = (_LANE >> 2) + 8 * ((_P >> 1) & 1)
_K_LOCAL = 16 * (_LANE & 3) + 4 * (2 * (_WI >> 1) + (_P & 1)) + 2 * (_WI & 1) + (_P >> 2)


def _chunk_q(words: NDArray[np.uint32]) -> NDArray[np.float64]:
    """(32 lanes, 4 words) of one chunk -> the (16 n, 64 k) nibbles."""
    q = (words[:, :, None] >> (4 * _P).astype(np.uint32)) & np.uint32(15)
    out = np.full((16, 64), np.nan)
    out[_N_LOCAL, _K_LOCAL] = q
    assert not np.isnan(out).any(), "the layout leaves a (n, k) of the chunk unread"
    return out


def simulate(
    packed: Mapping[str, np.ndarray],
    x: NDArray[np.float64],
    cfg_name: str,
    mt: int,
    grid: tuple[int, int],
    block: int,
    smem: int,
    sn: int,
    sk: int,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """out (M, N) = x @ W as the gv kernel ``cfg_name`` (8*mt-row tiles) computes it for one launch
    (grid, block threads, dynamic shared memory, sn x sk warps per block), and which outputs were
    written."""
    k, n, g, kind = (int(v) for v in packed["meta"])
    qw = np.ascontiguousarray(packed["qweight"], np.uint32)
    sz = np.ascontiguousarray(packed["sz"], np.uint32)
    wbytes, sbytes = qw.reshape(-1).view(np.uint8), sz.reshape(-1).view(np.uint8)
    c = GV_CONFIGS[cfg_name]
    cpg = g // 64
    SC = c.stage_chunks(cpg)
    GPS = SC // cpg
    NST = c.nst
    STAGE_BYTES = SC * 512 + GPS * 64
    KC, G = k // 64, k // g
    m = x.shape[0]
    nwarps = block // 32
    assert nwarps == sn * sk and sn * sk <= 16
    bar_bytes = ((nwarps * NST * 8 + 127) & ~127) if c.load == "bulk" else 0
    assert smem == bar_bytes + nwarps * NST * STAGE_BYTES + nwarps * mt * 512, "shared memory layout"
    out = np.zeros((m, n))
    writes = np.zeros((m, n), bool)

    def warp_part(xr: NDArray[np.float64], strip: int, gb: int, ng: int) -> NDArray[np.float64]:
        """One warp's (8*mt rows, 16 columns) partial sum through its ring."""
        nch = ng * cpg
        nstage = (nch + SC - 1) // SC
        ring = np.zeros(NST * STAGE_BYTES, np.uint8)
        held = [-1] * NST  # the stage each slot holds
        fills = [0] * NST  # completed fills (mbarrier phases) per slot
        w0 = (strip * KC + gb * cpg) * 32 * 16  # byte offset of the warp's first chunk
        s0 = (strip * G + gb) * 4 * 16  # ... and of its first group's scale words

        def fill(slot: int, s: int) -> None:
            nc = min(SC, nch - s * SC)
            ngr = nc // cpg
            dst = slot * STAGE_BYTES
            wsrc, ssrc = w0 + s * SC * 512, s0 + s * GPS * 64
            if c.load == "bulk":  # lane 0: two contiguous copies
                ring[dst : dst + nc * 512] = wbytes[wsrc : wsrc + nc * 512]
                ring[dst + SC * 512 : dst + SC * 512 + ngr * 64] = sbytes[ssrc : ssrc + ngr * 64]
            else:  # cp.async: every lane its 16 bytes of each chunk, lanes < 4 ngr the scale words
                for cc in range(nc):
                    for lane in range(32):
                        o = cc * 512 + lane * 16
                        ring[dst + o : dst + o + 16] = wbytes[wsrc + o : wsrc + o + 16]
                for lane in range(4 * ngr):
                    o = SC * 512 + lane * 16
                    ring[dst + o : dst + o + 16] = sbytes[ssrc + lane * 16 : ssrc + lane * 16 + 16]
            assert dst + SC * 512 + ngr * 64 <= NST * STAGE_BYTES, "a copy past the warp's ring"
            held[slot] = s
            fills[slot] += 1

        for s in range(min(NST, nstage)):  # the prologue
            fill(s, s)
        part = np.zeros((xr.shape[0], 16))
        done = []
        for s in range(nstage):
            si = s % NST
            assert held[si] == s, f"slot {si} holds stage {held[si]}, not {s}"
            if c.load == "bulk":
                assert fills[si] - 1 == s // NST, "the mbarrier phase waited on is not the slot's fill"
            st = si * STAGE_BYTES
            for gi in range(min(GPS, ng - s * GPS)):
                so = st + SC * 512 + gi * 64
                words = ring[so : so + 64].view(np.uint32).reshape(8, 2)  # [g8][rowhi]
                wcol = np.concatenate([words[:, 0], words[:, 1]])  # n = r + 8 rowhi
                scale = _scale_f(wcol, kind)
                zero = (wcol >> np.uint32(16)).astype(np.float64)
                cg = np.zeros((xr.shape[0], 16))
                for cc in range(cpg):
                    wo = st + (gi * cpg + cc) * 512
                    chunk = (gb + s * GPS + gi) * cpg + cc
                    done.append(chunk)
                    q = _chunk_q(ring[wo : wo + 512].view(np.uint32).reshape(32, 4))
                    cg += xr[:, 64 * chunk : 64 * chunk + 64] @ (q - zero[:, None]).T
                part += cg * scale[None, :]
            if s + NST < nstage:  # the refill, once the stage is consumed
                fill(si, s + NST)
        assert done == list(range(gb * cpg, (gb + ng) * cpg)), "the warp's K slice, each chunk once"
        return part

    for by in range(grid[1]):
        for bx in range(grid[0]):
            m0 = bx * 8 * mt
            rows = np.arange(m0, m0 + 8 * mt)
            xr = x[np.where(rows < m, rows, m0)]  # rows past M read row m0 (never stored)
            ok = rows < m
            for warp in range(nwarps):
                wn, wk = warp % sn, warp // sn
                strip = by * sn + wn
                gb, ge = G * wk // sk, G * (wk + 1) // sk
                if strip >= n // 16 or ge <= gb:
                    continue
                cols = 16 * strip + np.arange(16)
                out[np.ix_(rows[ok], cols)] += warp_part(xr, strip, gb, ge - gb)[ok]
                writes[np.ix_(rows[ok], cols)] = True
    return out, writes
