"""INT4 GEMM for 16 <= M <= MAX_M on AVX-512 CPUs: register-blocked FMAs on weights dequantized in registers.

Why: at M = 32 the multiply bounds the GEMM. OpenBLAS's sgemm reaches ~38-41 GMAC/s per core at
M = 32 (single thread, 2-core CI machine) against ~70-85 GMAC/s of FMA peak, and the tiled path
(gemm_tiled.py) adds a store of every dequantized weight plus OpenBLAS's own repack of the tile.
Here a weight is dequantized in a register and used for every row of x with no store in between.

Block (emitted as LLVM IR through numba's @intrinsic, ``_make_block``; x (M, K) f32, W as Int4Weight):
- ``rows`` (MR = 16, or MR_TAIL = 8 for a last group of <= 8 rows) rows of x times 16 columns of W,
  over K rows k0..k1 (whole groups): one zmm accumulator per row. Per packed row j (K rows 2j and
  2j + 1): one 16-byte load zero-extended to 16 int32 lanes, nibbles split with one AND and one
  shift, converted, and dequantized as (q - z) * s = q * s + (-z * s) (one FMA each;
  Int4Weight.neg_zs_f32; s and -z*s loaded once per group); then 2 * rows FMAs whose x operand is
  a broadcast load from x transposed (xt (K, MP): the 16 values of one K row in one cache line).
- M > 16 needs several blocks per strip of 16 columns (32 accumulators do not fit beside the
  weights): the first one also stores the dequantized weights of the pass to a per-thread buffer
  (KC * 16 * 4 B = 32 KiB, L1) and the others load them from it instead of decoding again, so a
  packed row costs 7 decode ops + 2 stores per 32 rows instead of 7 per 16 (M = 32: 0.73-0.95x
  the time of decoding in every block; one interleaved run, three shapes, both bench modes).
- Packed rows are N bytes apart, a new 4 KiB page per row for N >= 4096, which defeats the
  hardware prefetcher: the block prefetches the row PREFETCH_ROWS ahead (without it, 0.5-0.7x the
  speed of the same kernel on weights repacked column-strip-major; with it, within ~10% of that).
- The accumulators are stored (first K pass) or added to out at the end of the block.

Driver (numba prange): N is split into chunks of at most CHUNK_COLS columns, a multiple of 16, as
many chunks as a multiple of the thread count; a task walks K in passes of KC rows, then strips of
16 columns, then blocks of rows. The N % 16 last columns are summed by a scalar loop in the last
chunk. Bias, activation and residual are applied to the chunk while it is in cache.
"""

from __future__ import annotations

import functools
from typing import Any

import llvmlite.binding as ll
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from anvil_kernels import _jit
from anvil_kernels.activations import epilogue_cols
from anvil_kernels.format import Int4Weight
from anvil_kernels.workspace import Workspace

MAX_M = 48  # rows of x up to which gemm.py picks this kernel over gemm_tiled; see docs/int4.md
MR = 16  # rows of x per block: MR accumulators + s, -z*s, two weight vectors, temporaries <= 32 zmm
MR_TAIL = 8  # block height for a last group of <= 8 rows (fewer padded rows computed and dropped)
COLS = 16  # columns per block: one zmm of float32
# K rows per pass, a multiple of every group size (32..256) so passes hold whole groups; the
# reused weights of a pass (KC * COLS * 4 B = 32 KiB) stay in L1. 1024 measured alike.
KC = 512
CHUNK_COLS = 1024  # at most this many columns per prange task
PREFETCH_ROWS = 8  # packed rows ahead; 8-24 measured alike, none was 0.5-0.7x the speed

_V16F = ir.VectorType(ir.FloatType(), 16)
_V16I = ir.VectorType(ir.IntType(32), 16)
_V16B = ir.VectorType(ir.IntType(8), 16)


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512F: NUMBA_CPU_FEATURES if set, else the host's
    features unless NUMBA_CPU_NAME names another (portable) CPU. Without it the 16 float32 lanes of
    a block would be split over two registers and the accumulators would no longer fit."""
    if getattr(numba.config, "DISABLE_JIT", False):
        return False  # the block only exists in compiled code
    features = getattr(numba.config, "CPU_FEATURES", None)
    if features is None:
        if getattr(numba.config, "CPU_NAME", None) not in (None, "host"):
            return False
        features = ll.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


# Where a block takes its weights: decoded from packed; decoded and also stored to wbuf; read from wbuf.
DEQUANT, DEQUANT_KEEP, REUSE = 0, 1, 2


def _c_2d(arr: Any, dtype: Any) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C" and arr.dtype == dtype


def _make_block(rows: int, source: int) -> Any:
    """The intrinsic for blocks of ``rows`` rows of x (one per height: the accumulators are
    registers) taking weights per ``source``."""

    @intrinsic
    def block(typingctx, xt, packed, s, nzs, g, k0, k1, col, m0, mr, out, first, wbuf):  # type: ignore[no-untyped-def]
        """out[m0:m0+mr, col:col+16] (=|+=) x[m0:m0+mr, k0:k1] @ W[k0:k1, col:col+16]; k0, k1 multiples
        of g, col + 16 <= N, m0 + rows <= MP (xt's padded row count); wbuf 1-D, 64-byte aligned."""
        f32 = types.float32
        if not all(
            _c_2d(a, t) for a, t in ((xt, f32), (packed, types.uint8), (s, f32), (nzs, f32), (out, f32))
        ):
            return None  # raw pointer arithmetic below: only C-contiguous 2-D arrays of these dtypes
        ip = types.intp
        sig = types.void(xt, packed, s, nzs, ip, ip, ip, ip, ip, ip, out, types.boolean, wbuf)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            g_v, k0_v, k1_v, col_v, m0_v, mr_v = args[4:10]
            first_v = args[11]
            xa, pa, sa, za, oa, wba = (
                context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 2, 3, 10, 12)
            )
            i32, i64 = ir.IntType(32), ir.IntType(64)

            def const(v: int) -> ir.Constant:
                return ir.Constant(i64, v)

            def vec_at(base: ir.Value, off: ir.Value, ty: ir.Type = _V16F) -> ir.Value:
                return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())

            def splat(v: ir.Value) -> ir.Value:
                undef = ir.Constant(_V16F, ir.Undefined)
                one = builder.insert_element(undef, v, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, undef, ir.Constant(_V16I, [0] * 16))

            mp = builder.extract_value(xa.shape, 1)
            n_cols = builder.extract_value(pa.shape, 1)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16F, [_V16F] * 3), "llvm.fma.v16f32"
            )
            prefetch = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
                "llvm.prefetch.p0i8",
            )
            read_keep_data = [ir.Constant(i32, v) for v in (0, 3, 1)]  # read, high locality, data
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, None)) for _ in range(rows)]
            low = ir.Constant(_V16I, [15] * 16)
            four = ir.Constant(_V16I, [4] * 16)
            half_g = builder.sdiv(g_v, const(2))  # packed rows per group
            g0 = builder.sdiv(k0_v, g_v)
            j0 = builder.sdiv(k0_v, const(2))
            with cgutils.for_range(builder, builder.sdiv(builder.sub(k1_v, k0_v), g_v)) as gl:
                gi = builder.add(g0, gl.index)
                goff = builder.add(builder.mul(gi, n_cols), col_v)
                sv = builder.load(vec_at(sa.data, goff), align=4)  # (16,) scales of group gi
                zv = builder.load(vec_at(za.data, goff), align=4)  # (16,) -zero * scale
                with cgutils.for_range(builder, half_g) as jl:
                    j = builder.add(builder.mul(gi, half_g), jl.index)  # packed row: K rows 2j, 2j + 1
                    # wbuf holds w_lo, w_hi of packed row j at 32 * (j - k0 / 2) floats
                    p_lo = vec_at(wba.data, builder.mul(builder.sub(j, j0), const(32)))
                    p_hi = builder.gep(p_lo, [const(1)])
                    if source == REUSE:
                        w_lo = builder.load(p_lo, align=64)
                        w_hi = builder.load(p_hi, align=64)
                    else:
                        bp = builder.gep(pa.data, [builder.add(builder.mul(j, n_cols), col_v)])
                        # never faults, so rows past the end are harmless
                        ahead = builder.gep(bp, [builder.mul(n_cols, const(PREFETCH_ROWS))])
                        builder.call(prefetch, [ahead, *read_keep_data])
                        u = builder.load(builder.bitcast(bp, _V16B.as_pointer()), align=1)
                        u = builder.zext(u, _V16I)
                        w_lo = builder.call(fma, [builder.sitofp(builder.and_(u, low), _V16F), sv, zv])
                        w_hi = builder.call(fma, [builder.sitofp(builder.lshr(u, four), _V16F), sv, zv])
                        if source == DEQUANT_KEEP:
                            builder.store(w_lo, p_lo, align=64)
                            builder.store(w_hi, p_hi, align=64)
                    x_lo = builder.gep(
                        xa.data, [builder.add(builder.mul(builder.mul(j, const(2)), mp), m0_v)]
                    )
                    x_hi = builder.gep(x_lo, [mp])
                    for r in range(rows):
                        for xrow, wv in ((x_lo, w_lo), (x_hi, w_hi)):
                            xv = splat(builder.load(builder.gep(xrow, [const(r)])))
                            builder.store(builder.call(fma, [xv, wv, builder.load(accs[r])]), accs[r])
            for r in range(rows):
                with builder.if_then(builder.icmp_signed("<", const(r), mr_v)):
                    op = vec_at(oa.data, builder.add(builder.mul(builder.add(m0_v, const(r)), n_cols), col_v))
                    acc = builder.load(accs[r])
                    with builder.if_else(first_v) as (then, other):
                        with then:
                            builder.store(acc, op, align=4)
                        with other:
                            builder.store(builder.fadd(builder.load(op, align=4), acc), op, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block


_block = _make_block(MR, DEQUANT)
_block_keep = _make_block(MR, DEQUANT_KEEP)
_block_reuse = _make_block(MR, REUSE)
_block_tail = _make_block(MR_TAIL, DEQUANT)
_block_tail_reuse = _make_block(MR_TAIL, REUSE)


def padded_rows(m: int) -> int:
    """Rows of xt: blocks of MR, the last one MR_TAIL high when <= MR_TAIL rows are left."""
    full, rest = divmod(m, MR)
    return full * MR + (0 if rest == 0 else MR_TAIL if rest <= MR_TAIL else MR)


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, boundscheck=False, error_model="numpy")
def _int4_matmul_fma_cpu(
    x: np.ndarray,  # (M, K) f32
    xt: np.ndarray,  # (K, MP) f32 scratch, x transposed, rows M..MP zero
    packed: np.ndarray,  # (K/2, N) u8
    s: np.ndarray,  # (K/g, N) f32
    nzs: np.ndarray,  # (K/g, N) f32, -zero * scale (Int4Weight.neg_zs_f32)
    g: int,
    nb: int,  # columns per task, a multiple of COLS
    out: np.ndarray,  # (M, N) f32
    bias: np.ndarray,  # (N,) f32 or empty
    act: int,
    residual: np.ndarray,  # (M, N) f32 or empty
    wbuf: np.ndarray,  # (threads, KC * COLS) f32 scratch, 64-byte aligned rows: one strip's weights
) -> None:
    m_rows, k_dim = x.shape
    mp = xt.shape[1]
    n_cols = out.shape[1]
    n_vec = n_cols - n_cols % COLS  # columns the blocks cover
    for kb in prange((k_dim + KC - 1) // KC):  # x transposed once per call, shared by every task
        for k in range(kb * KC, min(k_dim, kb * KC + KC)):
            for m in range(m_rows):
                xt[k, m] = x[m, k]
            for m in range(m_rows, mp):
                xt[k, m] = 0.0  # padded rows: finite, never stored
    chunks = (n_cols + nb - 1) // nb
    for c in prange(chunks):
        n0 = c * nb
        n1 = min(n_cols, n0 + nb)
        wb = wbuf[numba.get_thread_id()]
        for k0 in range(0, k_dim, KC):
            k1 = min(k_dim, k0 + KC)
            first = k0 == 0
            for col in range(n0, min(n1, n_vec), COLS):
                if m_rows <= MR_TAIL:
                    _block_tail(xt, packed, s, nzs, g, k0, k1, col, 0, m_rows, out, first, wb)
                elif m_rows <= MR:
                    _block(xt, packed, s, nzs, g, k0, k1, col, 0, m_rows, out, first, wb)
                else:  # the first block dequantizes into wbuf (L1), the others read it back
                    _block_keep(xt, packed, s, nzs, g, k0, k1, col, 0, MR, out, first, wb)
                    for m0 in range(MR, m_rows, MR):
                        left = m_rows - m0
                        if left <= MR_TAIL:
                            _block_tail_reuse(xt, packed, s, nzs, g, k0, k1, col, m0, left, out, first, wb)
                        else:
                            _block_reuse(
                                xt, packed, s, nzs, g, k0, k1, col, m0, min(MR, left), out, first, wb
                            )
        for n in range(max(n0, n_vec), n1):  # N % COLS columns, last chunk only
            for m in range(m_rows):
                out[m, n] = 0.0
            for k in range(k_dim):
                b = packed[k // 2, n]
                q = np.float32(np.uint8(b & np.uint8(15)) if k % 2 == 0 else np.uint8(b >> np.uint8(4)))
                wv = q * s[k // g, n] + nzs[k // g, n]
                for m in range(m_rows):
                    out[m, n] += x[m, k] * wv
        epilogue_cols(out, bias, act, residual, n0, n1)


def chunk_width(n: int, threads: int) -> int:
    """Columns per task: a multiple of COLS, at most CHUNK_COLS, with the chunk count a multiple of
    ``threads`` where N allows, so that every thread gets the same number of columns (11008
    columns on 2 threads: 12 chunks of 928, not 11 of 1024)."""
    threads = max(threads, 1)
    per_thread = -(-n // threads)
    chunks = threads * -(-per_thread // CHUNK_COLS)
    nb = -(-n // chunks)
    return -(-nb // COLS) * COLS


def int4_matmul_fma(
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
    assert available()
    xt = ws.get("int4.xt", (w.k, padded_rows(x.shape[0])))
    threads = numba.get_num_threads()
    nb = chunk_width(w.n, threads)
    wbuf = ws.get("int4.wbuf", (threads, KC * COLS + 16))
    off = (-wbuf.ctypes.data // 4) % 16  # 64-byte aligned rows
    wbuf = wbuf[:, off : off + KC * COLS]
    s, nzs = w.scales_f32, w.neg_zs_f32
    _int4_matmul_fma_cpu(x, xt, w.packed, s, nzs, w.group_size, nb, out, bias, act, residual, wbuf)
