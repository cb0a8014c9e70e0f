"""fp32 linear with its epilogue fused: ``out = LN?(act(x @ W + bias) + residual)``.

Design (x (M, K), W (K, N), out (M, N), float32, row-major):
- The output is cut into tiles (``tiles``: blocks of rows, or of columns where M is small), one
  numba task each; a task calls numpy's own OpenBLAS sgemm single-threaded on its tile
  (``_openblas``), then applies the epilogue to it while it is in cache: bias + activation (GELU
  through ``varlen.erf_fast``), or bias + residual + LayerNorm (whole rows; after a second pass
  where tiles split the columns). One pass over the output instead of three, and one thread pool:
  numba's threads run the BLAS calls, so OpenBLAS's own spinning workers never compete with
  numba's (see _openblas).
- Where numpy uses another BLAS (SGEMM is None): numpy's matmul, then the same epilogue kernels.

Used by the plan runtime's CPU backend for unquantized linears (packed token rows or padded).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import njit, prange

from anvil_kernels import _jit, _openblas, gemm_f32_avx512
from anvil_kernels import _validate as v
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.varlen import _act_row, _bias_act, _bias_res_ln, _ln_row
from anvil_kernels.workspace import Workspace

__all__ = ["f32_linear", "tiles"]

# rows per tile: enough that packing the tile's W slice (every sgemm call does) is small next to
# its FMAs, few enough for balance between threads
MIN_BLOCK, MAX_BLOCK = 64, 256


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, nogil=True, error_model="numpy")
def _linear_tiles(
    sgemm: Any,
    x: np.ndarray,  # (M, K) f32
    w: np.ndarray,  # (K, N) f32
    y: np.ndarray,  # (M, N) f32: the GEMM's output (out itself, or scratch when ln)
    bias: np.ndarray,  # (N,) or (0,)
    act: int,
    res: np.ndarray,  # (M, N) or (0, 0)
    ln: bool,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,  # (M, N) f32
    block: int,  # rows per tile
    cols: int,  # columns per tile (N: whole rows, so LN is fused into the tile)
) -> None:  # pragma: no cover (numba)
    m_rows, k_dim = x.shape
    n = w.shape[1]
    row_tiles = (m_rows + block - 1) // block
    col_tiles = (n + cols - 1) // cols
    for t in prange(row_tiles * col_tiles):
        r0 = (t // col_tiles) * block
        r1 = min(m_rows, r0 + block)
        c0 = (t % col_tiles) * cols
        c1 = min(n, c0 + cols)
        sgemm(
            _openblas.ROW_MAJOR, _openblas.NO_TRANS, _openblas.NO_TRANS, r1 - r0, c1 - c0, k_dim,
            np.float32(1.0), x[r0:].ctypes.data, k_dim, w.ctypes.data + 4 * c0, n,
            np.float32(0.0), y[r0:].ctypes.data + 4 * c0, n,
        )  # fmt: skip
        for r in range(r0, r1):
            if ln:
                if col_tiles == 1:  # whole rows: LN while they are in cache
                    _ln_row(y[r], bias, res[r] if res.size else bias[0:0], gamma, beta, eps, out[r])
            else:
                _act_row(y[r, c0:c1], bias[c0:c1] if bias.size else bias, act)
                if res.size:
                    for i in range(c0, c1):
                        y[r, i] += res[r, i]
    if ln and col_tiles > 1:  # LN needs whole rows: a second pass once every column is there
        for r in prange(m_rows):
            _ln_row(y[r], bias, res[r] if res.size else bias[0:0], gamma, beta, eps, out[r])


def tiles(m: int, n: int, threads: int) -> tuple[int, int]:
    """(rows, columns) per sgemm tile: a task per tile, at least ``threads`` tiles. Each sgemm call
    packs its whole (K, columns) slice of W, so rows are split only where every tile keeps
    >= MIN_BLOCK rows (one thread: tiles of MAX_BLOCK rows); fewer rows than that are split by
    columns instead (multiples of 16, one SIMD width), each thread packing only its own columns.
    (Split into tiles of 16 rows at M = 22, one thread packed W twice: 1.6-1.8x one sgemm's time.)"""
    if threads <= 1 or m >= threads * MIN_BLOCK:
        block = min(MAX_BLOCK, max(MIN_BLOCK, -(-m // (2 * threads)))) if threads > 1 else MAX_BLOCK
        return min(block, m), n
    cols = -(-n // threads)
    return m, min(n, -(-cols // 16) * 16)


def f32_linear(
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None = None,
    act: str = "none",
    residual: np.ndarray | None = None,
    ln: tuple[np.ndarray, np.ndarray, float] | None = None,
    workspace: Workspace | None = None,
    packed: np.ndarray | None = None,
) -> np.ndarray:
    """``out = LN(act(x @ w + bias) + residual)`` (LN only when ``ln = (gamma, beta, eps)``).
    x (M, K), w (K, N), out and residual (M, N), bias/gamma/beta (N,): float32, C-contiguous;
    out must not alias x or w (it may alias residual only row for row, i.e. be residual itself,
    when ``ln`` is given). ``packed``: ``gemm_f32_avx512.pack(w)``, made once by the caller; with it,
    M <= gemm_f32_avx512.MAX_M runs on that kernel (no per-call repack of w). Returns out."""
    v.array("x", x, np.float32, 2)
    m, k = x.shape
    v.array("w", w, np.float32, 2)
    if w.shape[0] != k:
        raise ValueError(f"w must have K={k} rows, got shape {w.shape}")
    n = w.shape[1]
    v.array("out", out, np.float32, 2, (m, n))
    v.writable("out", out)
    v.no_overlap("out", out, x=x, w=w)
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {act!r}")
    if bias is not None:
        v.array("bias", bias, np.float32, 1, (n,))
    if residual is not None:
        v.array("residual", residual, np.float32, 2, (m, n))
    b = _jit.EMPTY1 if bias is None else bias
    res = _jit.EMPTY2 if residual is None else residual
    ws = workspace or Workspace()
    if ln is not None:
        gamma, beta, eps = ln
        v.array("gamma", gamma, np.float32, 1, (n,))
        v.array("beta", beta, np.float32, 1, (n,))
        if act != "none":
            raise ValueError("act must be 'none' when ln is given (LN(x @ w + bias + residual))")
        y = ws.get("f32_linear.y", (m, n))
        eps_f = v.finite_scalar("eps", eps, positive=True)
    else:
        gamma = beta = _jit.EMPTY1
        y, eps_f = out, 1.0
        if residual is not None and np.shares_memory(out, residual):
            raise ValueError("out must not share memory with residual (without ln)")
    if packed is not None and m <= gemm_f32_avx512.MAX_M:
        v.array("packed", packed, np.float32, 3, (n // 16, k, 16))
        xt = ws.get("f32_linear.xt", (k * gemm_f32_avx512.padded_rows(m),)).reshape(-1)
        gemm_f32_avx512.matmul_packed(
            x, packed, y, b, ACTIVATIONS[act], res, ln is not None, gamma, beta, eps_f, out, xt
        )
        return out
    if _openblas.SGEMM is None:  # another BLAS: its matmul, then the epilogue kernels
        np.matmul(x, w, out=y)
        if ln is not None:
            _bias_res_ln(y, b, res, gamma, beta, eps_f, out)
        else:
            _bias_act(y, b, ACTIVATIONS[act])
            if residual is not None:
                out += residual
        return out
    block, cols = tiles(m, n, numba.get_num_threads())
    with _openblas.single_threaded():
        _linear_tiles(
            _openblas.SGEMM, x, w, y, b, ACTIVATIONS[act], res, ln is not None, gamma, beta, eps_f, out,
            block, cols,
        )  # fmt: skip
    return out
