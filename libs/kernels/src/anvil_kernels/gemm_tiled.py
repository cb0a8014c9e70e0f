"""INT4 GEMM for larger M: dequantize cache-sized weight tiles, multiply them with BLAS sgemm.

Why: at M >= BLAS_MIN_M the multiply, not the weight stream, bounds the GEMM, and numba's FMA
loop reaches only ~20-25 GMAC/s per core against OpenBLAS's ~32. Dequantizing costs one write
per weight per call, i.e. 1/M of the multiply's work, so it pays once M is large enough.

Design (x (M, K) f32, W as Int4Weight, out (M, N) f32):
- N is split into chunks of nb columns, one prange task per chunk. A task walks K in tiles of
  kt rows: it dequantizes (q - z) * s, computed as one FMA q * s + (-z * s), of its (kt, nb)
  block into its thread's scratch tile (kt * nb * 4 bytes = 512 KiB, stays in L2) and calls
  single-threaded sgemm on it,
  ``out[:, chunk] (+)= x[:, k-tile] @ tile`` (beta 0 on the first tile, then 1), so the partial
  sums never leave the caller's buffer.
- BLAS runs inside numba's threads with OpenBLAS held at one thread (_openblas.single_threaded):
  one thread pool, the same thread count as the rest of the kernels.
- Bias, activation and residual are applied to the chunk of out while it is still in cache.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import njit, prange

from anvil_kernels import _jit, _openblas
from anvil_kernels.activations import epilogue_cols
from anvil_kernels.format import Int4Weight
from anvil_kernels.workspace import Workspace

BLAS_MIN_M = 16  # rows of x from which this path is used; see docs/int4.md for the measurement
# Tile shape: K rows per tile (even: a pair of rows shares a packed byte) and columns at most;
# TILE_K * TILE_N * 4 B = 512 KiB, a quarter of L2. Each tile row is padded by TILE_PAD floats:
# unpadded, rows 4 KiB apart (1,024 floats) share their low 12 address bits with the rows of the
# scales/zeros they are computed from, and 4K aliasing between those loads and the tile's stores
# halved the speed when the buffers happened to line up (0.56-0.71x numpy on K = N = 4096 at
# M = 32, 1.19-1.26x padded; idle 2-core build machine, interleaved runs).
TILE_K = 128
TILE_N = 1024
TILE_PAD = 16

_U4 = np.uint8(4)
_U15 = np.uint8(15)


def available() -> bool:
    """Whether numpy's own OpenBLAS was found (else the pure-numba kernel is used for every M)."""
    return _openblas.SGEMM is not None


@njit(fastmath=_jit.ELEMENTWISE, cache=True, boundscheck=False, error_model="numpy")
def _dequant_tile(
    packed: np.ndarray,  # (K/2, N) u8
    s: np.ndarray,  # (K/g, N) f32
    nzs: np.ndarray,  # (K/g, N) f32, -zero * scale (Int4Weight.neg_zs_f32)
    g: int,
    k0: int,  # first K row, even
    k1: int,  # end K row, even
    n0: int,
    n1: int,
    tile: np.ndarray,  # (>= k1 - k0, >= n1 - n0) f32, written at [:k1 - k0, :n1 - n0]
) -> None:
    w = n1 - n0
    for jj in range((k1 - k0) // 2):
        k = k0 + 2 * jj  # K rows k, k + 1 share packed row k / 2 and (g even) one group
        row = packed[k // 2, n0:n1]
        sg = s[k // g, n0:n1]
        zg = nzs[k // g, n0:n1]
        t0 = tile[2 * jj, :w]
        t1 = tile[2 * jj + 1, :w]
        for i in range(w):
            b = row[i]
            t0[i] = np.float32(np.uint8(b & _U15)) * sg[i] + zg[i]  # one FMA: (q - z) * s
            t1[i] = np.float32(np.uint8(b >> _U4)) * sg[i] + zg[i]


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, boundscheck=False, error_model="numpy")
def _int4_matmul_tiled_cpu(
    sgemm: Any,  # ctypes cblas_sgemm (ILP64), _openblas.SGEMM
    x: np.ndarray,  # (M, K) f32
    packed: np.ndarray,  # (K/2, N) u8
    s: np.ndarray,  # (K/g, N) f32
    nzs: np.ndarray,  # (K/g, N) f32, -zero * scale
    g: int,
    tiles: np.ndarray,  # (threads, kt, nb + TILE_PAD) f32 scratch, one tile per numba thread
    nb: int,  # columns per task
    out: np.ndarray,  # (M, N) f32
    bias: np.ndarray,  # (N,) f32 or empty
    act: int,
    residual: np.ndarray,  # (M, N) f32 or empty
) -> None:
    m_rows, k_dim = x.shape
    n_cols = out.shape[1]
    kt, ldb = tiles.shape[1], tiles.shape[2]
    chunks = (n_cols + nb - 1) // nb
    for c in prange(chunks):
        n0 = c * nb
        n1 = min(n_cols, n0 + nb)
        t = tiles[numba.get_thread_id()]
        for k0 in range(0, k_dim, kt):
            k1 = min(k_dim, k0 + kt)
            _dequant_tile(packed, s, nzs, g, k0, k1, n0, n1, t)
            beta = np.float32(0.0) if k0 == 0 else np.float32(1.0)
            # row-major out[:, n0:n1] (ldc N) = x[:, k0:k1] (lda K) @ t[:k1-k0, :n1-n0] (ldb)
            sgemm(
                _openblas.ROW_MAJOR,
                _openblas.NO_TRANS,
                _openblas.NO_TRANS,
                m_rows,
                n1 - n0,
                k1 - k0,
                np.float32(1.0),
                x[:, k0:].ctypes.data,
                k_dim,
                t.ctypes.data,
                ldb,
                beta,
                out[:, n0:].ctypes.data,
                n_cols,
            )
        epilogue_cols(out, bias, act, residual, n0, n1)


def tile_width(n: int, threads: int) -> int:
    """Columns per task: TILE_N, or fewer (a multiple of 64) so that every thread gets a chunk."""
    per_thread = -(-n // max(threads, 1))
    return max(64, min(TILE_N, -(-per_thread // 64) * 64))


def int4_matmul_tiled(
    x: np.ndarray,
    w: Int4Weight,
    out: np.ndarray,
    bias: np.ndarray,
    act: int,
    residual: np.ndarray,
    ws: Workspace,
) -> None:
    """out = act(x @ W + bias) + residual; arguments already validated (gemm.int4_linear).
    bias/residual are empty arrays when absent. Requires available()."""
    assert _openblas.SGEMM is not None
    threads = numba.get_num_threads()
    nb = tile_width(w.n, threads)
    tiles = ws.get("int4.blas_tile", (threads, TILE_K, nb + TILE_PAD))
    with _openblas.single_threaded():
        _int4_matmul_tiled_cpu(
            _openblas.SGEMM,
            x,
            w.packed,
            w.scales_f32,
            w.neg_zs_f32,
            w.group_size,
            tiles,
            nb,
            out,
            bias,
            act,
            residual,
        )
