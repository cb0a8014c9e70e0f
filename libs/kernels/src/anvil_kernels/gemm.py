"""INT4 GEMM/GEMV with a fused epilogue: ``out = act(x @ W + bias) + residual``.

CPU kernel design (x (M, K) f32, W as Int4Weight):
- N is split into chunks, one prange task per chunk; a task streams its column range of every
  weight row (contiguous bytes) and vectorizes across N, so there is no horizontal reduction.
- Zero points are hoisted: per group, acc[m, n] = sum_k q[k, n] * x[m, k], then
  out[m, n] += s * (acc - z * sum_k x[m, k]) with the per-group sums of x computed once per call,
  so the inner loop is only nibble decode + int->float + FMA.
- M == 1 on AVX-512 VNNI CPUs (N a multiple of 64) writes x per group in fixed point as four
  signed int8 digits (x rounded by at most 2**-30 of the group's max |x|) and sums q * digit
  exactly in int32 with vpdpbusd (an LLVM intrinsic): 11 vector ops per word row of 16 columns
  against 24 for the fp32 GEMV below; 1.3-2x faster on the CI machine (docs/int4.md).
- Otherwise M == 1 (GEMV) reads ``w.words`` (K/8, N) uint32, eight K rows of a column per word:
  nibble r is isolated with one AND (no shift, no widening) and converted as q * 16**r, exact in
  float32, with 16**-r folded into x[k]. That is 3 vector ops per 16 weights (and, cvt, fma)
  against 4 for bytes (and/shift, widen, cvt, fma); the GEMV is bound by those ops, not by memory.
- 1 < M < gemm_tiled.BLAS_MIN_M decodes two packed rows of ``w.packed`` once into a float32
  tile and reuses it for every row of x (two rows of x per pass).
- Bias, activation and residual are applied to the chunk while it is still in cache.
- gemm_tiled.BLAS_MIN_M <= M <= gemm_avx512.MAX_M on AVX-512 CPUs: register-blocked FMA kernel that
  dequantizes in registers (gemm_avx512.py).
- Otherwise M >= gemm_tiled.BLAS_MIN_M dequantizes L2-sized tiles and multiplies them with OpenBLAS
  (gemm_tiled.py), where numpy's OpenBLAS is found (else gemm_avx512 for every such M, where it runs).
Scratch (acc, decoded tile, group sums, x digits) lives in a Workspace; pass one to avoid allocation.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from anvil_kernels import _jit, gemm_avx512, gemm_tiled, gemv
from anvil_kernels import _validate as v
from anvil_kernels.activations import ACTIVATIONS, epilogue_cols
from anvil_kernels.format import Int4Weight
from anvil_kernels.workspace import Workspace

_U4 = np.uint8(4)
_U15 = np.uint8(15)


@njit(fastmath=_jit.REDUCE, cache=True)
def _group_sums(x: np.ndarray, g: int, sx: np.ndarray) -> None:
    # x (M, K) f32 -> sx (M, K/g) f32: sum of x over each group of g inputs
    m_rows, groups = sx.shape
    for m in range(m_rows):
        for gi in range(groups):
            seg = x[m, gi * g : (gi + 1) * g]
            t = np.float32(0.0)
            for i in range(seg.size):
                t += seg[i]
            sx[m, gi] = t


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True)
def _int4_matmul_cpu(
    x: np.ndarray,  # (M, K) f32
    packed: np.ndarray,  # (K/2, N) u8
    s: np.ndarray,  # (K/g, N) f32
    z: np.ndarray,  # (K/g, N) f32
    sx: np.ndarray,  # (M, K/g) f32, group sums of x
    acc: np.ndarray,  # (M, N) f32 scratch
    tile: np.ndarray,  # (chunks, 4, nb) f32 scratch, decoded nibbles
    out: np.ndarray,  # (M, N) f32
    nb: int,  # columns per chunk
    bias: np.ndarray,  # (N,) f32 or empty
    act: int,
    residual: np.ndarray,  # (M, N) f32 or empty
) -> None:
    half_k, n_cols = packed.shape
    m_rows = x.shape[0]
    groups = s.shape[0]
    rows_per_group = half_k // groups  # packed rows per group (g / 2, even)
    chunks = (n_cols + nb - 1) // nb
    for c in prange(chunks):
        n0 = c * nb
        n1 = min(n_cols, n0 + nb)
        w = n1 - n0
        d = tile[c]
        for gi in range(groups):
            for m in range(m_rows):
                a = acc[m, n0:n1]
                for i in range(w):
                    a[i] = 0.0
            for jj in range(0, rows_per_group, 2):
                j = gi * rows_per_group + jj  # packed rows j, j+1 = K rows 2j .. 2j+3
                r0 = packed[j, n0:n1]
                r1 = packed[j + 1, n0:n1]
                q0 = d[0, :w]
                q1 = d[1, :w]
                q2 = d[2, :w]
                q3 = d[3, :w]
                for i in range(w):
                    q0[i] = np.float32(np.uint8(r0[i] & _U15))
                    q1[i] = np.float32(np.uint8(r0[i] >> _U4))
                    q2[i] = np.float32(np.uint8(r1[i] & _U15))
                    q3[i] = np.float32(np.uint8(r1[i] >> _U4))
                for m in range(0, m_rows - 1, 2):
                    a = acc[m, n0:n1]
                    b = acc[m + 1, n0:n1]
                    xa0, xa1, xa2, xa3 = x[m, 2 * j], x[m, 2 * j + 1], x[m, 2 * j + 2], x[m, 2 * j + 3]
                    xb0, xb1 = x[m + 1, 2 * j], x[m + 1, 2 * j + 1]
                    xb2, xb3 = x[m + 1, 2 * j + 2], x[m + 1, 2 * j + 3]
                    for i in range(w):
                        t = a[i]
                        t += q0[i] * xa0
                        t += q1[i] * xa1
                        t += q2[i] * xa2
                        t += q3[i] * xa3
                        a[i] = t
                        u = b[i]
                        u += q0[i] * xb0
                        u += q1[i] * xb1
                        u += q2[i] * xb2
                        u += q3[i] * xb3
                        b[i] = u
                if m_rows % 2 == 1:
                    m = m_rows - 1
                    a = acc[m, n0:n1]
                    xa0, xa1, xa2, xa3 = x[m, 2 * j], x[m, 2 * j + 1], x[m, 2 * j + 2], x[m, 2 * j + 3]
                    for i in range(w):
                        t = a[i]
                        t += q0[i] * xa0
                        t += q1[i] * xa1
                        t += q2[i] * xa2
                        t += q3[i] * xa3
                        a[i] = t
            sg = s[gi, n0:n1]
            zg = z[gi, n0:n1]
            for m in range(m_rows):
                gemv.scale_group(out[m, n0:n1], acc[m, n0:n1], sg, zg, sx[m, gi], np.float32(1.0), gi == 0)
        epilogue_cols(out, bias, act, residual, n0, n1)


GEMM_MAX_CHUNK = 1024  # columns; measured best of 128..2048 for M = 8 and 32 (bench/kernels_cpu.py)


def chunk_width(m: int, n: int, threads: int) -> int:
    """Columns per prange task: one chunk per thread for GEMV (pure streaming), at most
    GEMM_MAX_CHUNK for M > 1 so that tasks balance. A multiple of 64 (one cache line of bytes)."""
    per_thread = -(-n // max(threads, 1))
    nb = per_thread if m == 1 else min(per_thread, GEMM_MAX_CHUNK)
    return max(64, -(-nb // 64) * 64)


def int4_linear(
    x: np.ndarray,
    w: Int4Weight,
    out: np.ndarray,
    bias: np.ndarray | None = None,
    activation: str = "none",
    residual: np.ndarray | None = None,
    workspace: Workspace | None = None,
) -> np.ndarray:
    """``out = act(x @ W + bias) + residual`` for x (M, K) float32 and an INT4 weight W (K, N).

    activation: "none" | "relu" | "gelu_erf" | "gelu_tanh" | "silu". All arrays float32 and
    C-contiguous; out (M, N) is written in full and must not alias any input. Pass a Workspace
    to reuse scratch across calls (otherwise a fresh one is allocated). Returns ``out``.
    """
    if not isinstance(w, Int4Weight):
        raise ValueError(f"w must be an Int4Weight, got {type(w).__name__}")
    v.array("x", x, np.float32, 2)
    m = x.shape[0]
    if x.shape[1] != w.k:
        raise ValueError(f"x must have shape (M, K={w.k}) to match w, got {x.shape}")
    v.positive_dims("x", x.shape)
    v.array("out", out, np.float32, 2, (m, w.n))
    v.writable("out", out)
    if bias is not None:
        v.array("bias", bias, np.float32, 1, (w.n,))
    if residual is not None:
        v.array("residual", residual, np.float32, 2, (m, w.n))
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    v.no_overlap("out", out, x=x, bias=bias, residual=residual)
    if workspace is not None and not isinstance(workspace, Workspace):
        raise ValueError(f"workspace must be a Workspace or None, got {type(workspace).__name__}")
    return _int4_linear_cpu(x, w, out, bias, ACTIVATIONS[activation], residual, workspace or Workspace())


def _int4_linear_cpu(
    x: np.ndarray,
    w: Int4Weight,
    out: np.ndarray,
    bias: np.ndarray | None,
    act: int,
    residual: np.ndarray | None,
    ws: Workspace,
) -> np.ndarray:
    m = x.shape[0]
    bias_arr = _jit.EMPTY1 if bias is None else bias
    res_arr = _jit.EMPTY2 if residual is None else residual
    blas = gemm_tiled.available()
    if m >= gemm_tiled.BLAS_MIN_M and gemm_avx512.available() and (m <= gemm_avx512.MAX_M or not blas):
        gemm_avx512.int4_matmul_fma(x, w, out, bias_arr, act, res_arr, ws)
        return out
    if m >= gemm_tiled.BLAS_MIN_M and blas:
        gemm_tiled.int4_matmul_tiled(x, w, out, bias_arr, act, res_arr, ws)
        return out
    nb = chunk_width(m, w.n, numba.get_num_threads())
    chunks = -(-w.n // nb)
    sx = ws.get("int4.sx", (m, w.num_groups))
    acc = ws.get("int4.acc", (m, w.n))
    tile = ws.get("int4.tile", (chunks, 4, nb) if m > 1 else (chunks, 4, 0))  # GEMV needs none
    _group_sums(x, w.group_size, sx)
    if m == 1 and w.n % gemv.VNNI_COLS == 0 and gemv.vnni512():
        dig = ws.get("int4.xdig", (w.k // 8, 2 * gemv.VNNI_DIGITS)).view(np.uint8)  # (K/8, 8D)
        step = ws.get("int4.xstep", (1, w.num_groups))
        assert nb % gemv.VNNI_COLS == 0, "chunks must hold whole intrinsic steps"
        gemv.x_digits(x, w.group_size, dig, step)
        gemv.int4_gemv_vnni(
            w.words, w.scales_f32, w.zeros_f32, sx, dig, step, acc, out, nb, bias_arr, act, res_arr
        )
        return out
    if m == 1:
        gemv.int4_gemv_cpu(x, w.words, w.scales_f32, w.zeros_f32, sx, acc, out, nb, bias_arr, act, res_arr)
        return out
    _int4_matmul_cpu(
        x,
        w.packed,
        w.scales_f32,
        w.zeros_f32,
        sx,
        acc,
        tile,
        out,
        nb,
        bias_arr,
        act,
        res_arr,
    )
    return out
