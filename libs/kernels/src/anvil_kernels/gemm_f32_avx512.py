"""fp32 GEMM for small M on AVX-512 CPUs, over weights packed once at load: no per-call repack.

Why: OpenBLAS's sgemm packs its whole W operand on every call. For MiniLM's linears at the rows of
one or a few sentences (M = 1-64) that copy costs more than the multiply: py-spy of the served
encoder at concurrency 1 showed ``sgemm_itcopy`` (the pack) at 16% of the executor's samples and
``sgemm_kernel`` at 10%; torch (MKL/oneDNN) was 1.5-2x faster at M = 22. Here W is packed once
(``pack``: strips of 16 columns, contiguous along K, (N/16, K, 16)) and every call streams it.

Block (emitted as LLVM IR through numba's @intrinsic, ``_make_block``): ``rows`` (1, 4, 8 or 12)
rows of x times two strips (32 columns), over all of K: 2 x rows zmm accumulators (24 at 12 rows,
+ 2 weight vectors + a broadcast <= 32 registers). Per K row: two weight loads, ``rows`` broadcast
loads from x transposed (xt (K, MP): a K row's values of every row of x in one cache line) and
2 x rows FMAs, so at 12 rows the block is bound by the FMAs, not the loads. Rows past M (xt's
zero padding up to the block height) are computed and never stored.

Driver (numba prange): tasks are chunks of strip pairs; a task runs every block of rows on each
pair, so a pair's weights (K x 32 floats, 48 KiB at K = 384) are read from memory once and from
cache by the next block. The epilogue (bias + activation, + residual) runs per task on its columns;
LayerNorm, which needs whole rows, runs after as a second parallel pass.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from anvil_kernels import _jit
from anvil_kernels.gemm_avx512 import available
from anvil_kernels.varlen import _act_row, _ln_row

__all__ = ["MAX_M", "available", "matmul_packed", "pack", "packable"]

MAX_M = 128  # rows of x up to which f32_linear uses this kernel (above: OpenBLAS, its repack amortized)
HEIGHTS = (12, 8, 4, 1)  # block heights; 12 is the register budget (24 accumulators)
STRIP = 16  # columns per zmm of float32
PAIR = 2 * STRIP  # columns per block

_V16F = ir.VectorType(ir.FloatType(), 16)
_V16I = ir.VectorType(ir.IntType(32), 16)


def packable(w: np.ndarray) -> bool:
    """Whether ``pack`` takes this (K, N) weight here: float32, N a multiple of 32, AVX-512."""
    return w.ndim == 2 and w.dtype == np.float32 and w.shape[1] % PAIR == 0 and w.shape[1] > 0 and available()


def pack(w: np.ndarray) -> np.ndarray:
    """(K, N) float32 -> (N/16, K, 16): strip s holds columns 16s..16s+15 row after row, 64-byte
    aligned (one zmm load per K row of a strip)."""
    k, n = w.shape
    raw = np.empty(n * k + 16, np.float32)
    off = (-raw.ctypes.data // 4) % 16
    out = raw[off : off + n * k].reshape(n // STRIP, k, STRIP)
    out[...] = w.reshape(k, n // STRIP, STRIP).transpose(1, 0, 2)
    return out


def _c(arr: Any, ndim: int) -> bool:
    return (
        isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == ndim and arr.layout == "C"
    )


def _make_block(rows: int) -> Any:
    """The intrinsic for blocks of ``rows`` rows (the accumulators are registers)."""

    @intrinsic
    def block(typingctx, xt, wp, pair, m0, mr, out):  # type: ignore[no-untyped-def]
        """out[m0:m0+mr, 32*pair:32*pair+32] = x[m0:m0+mr] @ W[:, 32*pair:32*pair+32]; xt (K, MP)
        with m0 + rows <= MP; wp (N/16, K, 16) from ``pack``; mr <= rows."""
        if not (_c(xt, 2) and _c(wp, 3) and _c(out, 2)):
            return None  # raw pointer arithmetic below: only C-contiguous float32 arrays
        ip = types.intp
        sig = types.void(xt, wp, ip, ip, ip, out)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            pair_v, m0_v, mr_v = args[2:5]
            xa, wa, oa = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 5))
            i32, i64 = ir.IntType(32), ir.IntType(64)

            def const(v: int) -> ir.Constant:
                return ir.Constant(i64, v)

            def vec_at(base: ir.Value, off: ir.Value) -> ir.Value:
                return builder.bitcast(builder.gep(base, [off]), _V16F.as_pointer())

            mp = builder.extract_value(xa.shape, 1)
            k_dim = builder.extract_value(wa.shape, 1)
            n_cols = builder.extract_value(oa.shape, 1)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16F, [_V16F] * 3), "llvm.fma.v16f32"
            )
            undef = ir.Constant(_V16F, ir.Undefined)
            zeros = ir.Constant(_V16I, [0] * 16)
            accs = [
                [cgutils.alloca_once_value(builder, ir.Constant(_V16F, None)) for _ in range(2)]
                for _ in range(rows)
            ]
            strip0 = builder.mul(pair_v, const(2))
            base0 = builder.mul(builder.mul(strip0, k_dim), const(STRIP))  # wp[strip0, 0, 0]
            base1 = builder.add(base0, builder.mul(k_dim, const(STRIP)))  # wp[strip0 + 1, 0, 0]
            with cgutils.for_range(builder, k_dim) as kl:
                k = kl.index
                koff = builder.mul(k, const(STRIP))
                w0 = builder.load(vec_at(wa.data, builder.add(base0, koff)), align=64)
                w1 = builder.load(vec_at(wa.data, builder.add(base1, koff)), align=64)
                xrow = builder.gep(xa.data, [builder.add(builder.mul(k, mp), m0_v)])
                for r in range(rows):
                    xs = builder.load(builder.gep(xrow, [const(r)]))
                    xv = builder.shuffle_vector(
                        builder.insert_element(undef, xs, ir.Constant(i32, 0)), undef, zeros
                    )
                    for j, wv in enumerate((w0, w1)):
                        builder.store(builder.call(fma, [xv, wv, builder.load(accs[r][j])]), accs[r][j])
            col = builder.mul(pair_v, const(PAIR))
            for r in range(rows):
                with builder.if_then(builder.icmp_signed("<", const(r), mr_v)):
                    row_off = builder.add(builder.mul(builder.add(m0_v, const(r)), n_cols), col)
                    for j in range(2):
                        op = vec_at(oa.data, builder.add(row_off, const(j * STRIP)))
                        builder.store(builder.load(accs[r][j]), op, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block


_b12, _b8, _b4, _b1 = (_make_block(h) for h in HEIGHTS)


def padded_rows(m: int) -> int:
    """Rows of xt: the blocks' heights summed (each block the smallest of HEIGHTS that holds the
    rows left, or 12)."""
    mp, left = 0, m
    while left > 0:
        h = next((h for h in reversed(HEIGHTS) if h >= left), HEIGHTS[0])
        mp += h
        left -= min(h, left)
    return mp


@njit(
    parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, nogil=True, boundscheck=False, error_model="numpy"
)
def _matmul_packed(
    x: np.ndarray,  # (M, K) f32
    xt: np.ndarray,  # (K, MP) f32 scratch: x transposed, rows M..MP zero
    wp: np.ndarray,  # (N/16, K, 16) f32, from pack
    out: np.ndarray,  # (M, N) f32: the GEMM (+ epilogue unless ln)
    bias: np.ndarray,  # (N,) or (0,)
    act: int,
    res: np.ndarray,  # (M, N) or (0, 0)
    ln: bool,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    ln_out: np.ndarray,  # (M, N) f32: LN(out + bias + res) when ln
    pairs_per_task: int,
) -> None:  # pragma: no cover (numba)
    m_rows, k_dim = x.shape
    mp = xt.shape[1]
    n = out.shape[1]
    for k in range(k_dim):
        for m in range(m_rows):
            xt[k, m] = x[m, k]
        for m in range(m_rows, mp):
            xt[k, m] = 0.0  # padded rows: finite, never stored
    n_pairs = n // 32
    tasks = (n_pairs + pairs_per_task - 1) // pairs_per_task
    for t in prange(tasks):
        p0 = t * pairs_per_task
        p1 = min(n_pairs, p0 + pairs_per_task)
        for p in range(p0, p1):
            m0 = 0
            while m0 < m_rows:
                left = m_rows - m0
                if left > 8:
                    _b12(xt, wp, p, m0, min(left, 12), out)
                    m0 += 12
                elif left > 4:
                    _b8(xt, wp, p, m0, left, out)
                    m0 += 8
                elif left > 1:
                    _b4(xt, wp, p, m0, left, out)
                    m0 += 4
                else:
                    _b1(xt, wp, p, m0, left, out)
                    m0 += 1
        if not ln:
            c0, c1 = p0 * 32, p1 * 32
            for r in range(m_rows):
                _act_row(out[r, c0:c1], bias[c0:c1] if bias.size else bias, act)
                if res.size:
                    for i in range(c0, c1):
                        out[r, i] += res[r, i]
    if ln:
        for r in prange(m_rows):
            _ln_row(out[r], bias, res[r] if res.size else bias[0:0], gamma, beta, eps, ln_out[r])


def matmul_packed(
    x: np.ndarray,
    wp: np.ndarray,
    y: np.ndarray,
    bias: np.ndarray,
    act: int,
    res: np.ndarray,
    ln: bool,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,
    xt_buf: np.ndarray,
) -> None:
    """``y = x @ W`` with f32_linear's epilogue (into y; with ``ln``, LN of it into out). Arguments
    already validated by f32_linear (x (M <= MAX_M, K), wp = pack(W), y (M, N)); xt_buf: float32
    scratch of at least K x padded_rows(M)."""
    k = x.shape[1]
    xt = xt_buf[: k * padded_rows(x.shape[0])].reshape(k, -1)
    n_pairs = wp.shape[0] // 2
    threads = numba.get_num_threads()
    per_task = max(1, -(-n_pairs // (2 * threads))) if threads > 1 else n_pairs
    _matmul_packed(x, xt, wp, y, bias, act, res, ln, gamma, beta, eps, out, per_task)
