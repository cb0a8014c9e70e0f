"""INT4 GEMV (M == 1) kernels; ``gemm.int4_linear`` picks one (design: gemm.py's docstring, docs/int4.md).

- ``int4_gemv_vnni``: AVX-512 VNNI CPUs, N a multiple of VNNI_COLS. x is written per group in fixed
  point as VNNI_DIGITS signed int8 digits (``x_digits``) and sum q * digit is exact int32 (vpdpbusd,
  emitted as an LLVM intrinsic).
- ``int4_gemv_cpu``: everywhere else. Nibble r of ``w.words`` isolated with one AND, converted as
  q * 16**r (exact), 16**-r folded into x.
"""

from __future__ import annotations

import functools
import math

import llvmlite.binding as ll
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from anvil_kernels import _jit
from anvil_kernels.activations import epilogue_row


@njit(fastmath=_jit.ELEMENTWISE, cache=True)
def scale_group(
    o: np.ndarray, a: np.ndarray, sg: np.ndarray, zg: np.ndarray, sxg: float, a_scale: np.float32, first: bool
) -> None:
    """One group's zero-point-hoisted term over a chunk of columns:
    o (=|+=) s * (a * a_scale - z * sum_x), the first group writing o."""
    if first:
        for i in range(o.shape[0]):
            o[i] = sg[i] * (a[i] * a_scale - zg[i] * sxg)
    else:
        for i in range(o.shape[0]):
            o[i] += sg[i] * (a[i] * a_scale - zg[i] * sxg)


# Nibble r of a word sits at bits 4r; masking it in place leaves q * 16**r (an exact float32).
_NIB = (
    np.uint32(0xF),
    np.uint32(0xF0),
    np.uint32(0xF00),
    np.uint32(0xF000),
    np.uint32(0xF0000),
    np.uint32(0xF00000),
    np.uint32(0xF000000),
)
_TOP = np.uint32(28)  # nibble 7 is shifted down instead: masked in place it would not fit an int32


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, boundscheck=False, error_model="numpy")
def int4_gemv_cpu(
    x: np.ndarray,  # (1, K) f32
    words: np.ndarray,  # (K/8, N) u32, Int4Weight.words
    s: np.ndarray,  # (K/g, N) f32
    z: np.ndarray,  # (K/g, N) f32
    sx: np.ndarray,  # (1, K/g) f32, group sums of x
    acc: np.ndarray,  # (1, N) f32 scratch
    out: np.ndarray,  # (1, N) f32
    nb: int,  # columns per chunk
    bias: np.ndarray,  # (N,) f32 or empty
    act: int,
    residual: np.ndarray,  # (1, N) f32 or empty
) -> None:
    k8, n_cols = words.shape
    groups = s.shape[0]
    words_per_group = k8 // groups  # g / 8
    use_bias = bias.size > 0
    use_res = residual.size > 0
    m0, m1, m2, m3, m4, m5, m6 = _NIB
    chunks = (n_cols + nb - 1) // nb
    for c in prange(chunks):
        n0 = c * nb
        n1 = min(n_cols, n0 + nb)
        w = n1 - n0
        a = acc[0, n0:n1]
        o = out[0, n0:n1]
        for gi in range(groups):
            for i in range(w):
                a[i] = 0.0
            for jj in range(words_per_group):
                j = gi * words_per_group + jj  # word row j = K rows 8j .. 8j+7
                row = words[j, n0:n1]
                xs = x[0, 8 * j : 8 * j + 8]
                x0 = xs[0]  # xr = x[8j + r] / 16**r (exact: a power of two)
                x1 = xs[1] * np.float32(2.0**-4)
                x2 = xs[2] * np.float32(2.0**-8)
                x3 = xs[3] * np.float32(2.0**-12)
                x4 = xs[4] * np.float32(2.0**-16)
                x5 = xs[5] * np.float32(2.0**-20)
                x6 = xs[6] * np.float32(2.0**-24)
                x7 = xs[7]
                for i in range(w):
                    u = row[i]
                    t = a[i]
                    t += np.float32(np.int32(u & m0)) * x0  # int32: LLVM emits one vcvtdq2ps
                    t += np.float32(np.int32(u & m1)) * x1
                    t += np.float32(np.int32(u & m2)) * x2
                    t += np.float32(np.int32(u & m3)) * x3
                    t += np.float32(np.int32(u & m4)) * x4
                    t += np.float32(np.int32(u & m5)) * x5
                    t += np.float32(np.int32(u & m6)) * x6
                    t += np.float32(np.int32(u >> _TOP)) * x7
                    a[i] = t
            scale_group(o, a, s[gi, n0:n1], z[gi, n0:n1], sx[0, gi], np.float32(1.0), gi == 0)
        if use_bias or use_res or act != 0:
            bseg = bias[n0:n1] if use_bias else bias
            rseg = residual[0, n0:n1] if use_res else bias[0:0]
            epilogue_row(o, bseg, act, rseg, use_bias, use_res)


# AVX-512 VNNI GEMV: x is written in fixed point per group, x[k] ~= step_g * sum_d digit_d[k] * 256**(D-1-d)
# with D signed int8 digits, so sum_k q x is D exact int32 dot products (vpdpbusd: 4 u8 * s8 per lane).
VNNI_DIGITS = 4  # D: |x - fixed point| <= 2**-30 * max |x| of the group, inside MATMUL_RTOL
VNNI_COLS = 64  # columns per intrinsic call: four zmm of words, 4 * D independent int32 chains
_V16I = ir.VectorType(ir.IntType(32), 16)
_V16F = ir.VectorType(ir.FloatType(), 16)


@functools.cache
def vnni512() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI: NUMBA_CPU_FEATURES if set, else the
    host's features unless NUMBA_CPU_NAME names another (portable) CPU."""
    if getattr(numba.config, "DISABLE_JIT", False):
        return False  # the intrinsic only exists in compiled code
    features = getattr(numba.config, "CPU_FEATURES", None)  # read at import from NUMBA_CPU_*
    if features is None:
        if getattr(numba.config, "CPU_NAME", None) not in (None, "host"):
            return False
        features = ll.get_host_cpu_features().flatten()
    flags = features.split(",")
    return "+avx512vnni" in flags and "+avx512bw" in flags


def _splat(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A scalar i32 broadcast to <16 x i32>."""
    vec = builder.insert_element(ir.Constant(_V16I, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vec, ir.Constant(_V16I, ir.Undefined), ir.Constant(_V16I, [0] * 16))


@intrinsic
def _vnni_dots(typingctx, words, j0, col, wpg, dig, res):  # type: ignore[no-untyped-def]
    """res[0, col:col+VNNI_COLS] = sum over word rows j0..j0+wpg of the fixed-point dot products, as
    sum_d 256**(D-1-d) * sum_j (q . digit_d); the caller multiplies by the group's step."""
    for arr, dtype in ((words, types.uint32), (dig, types.uint8), (res, types.float32)):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C" and arr.dtype == dtype):
            return None  # raw pointer arithmetic below: only C-contiguous 2-D arrays of these dtypes
    sig = types.void(words, types.intp, types.intp, types.intp, dig, res)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        w_arg, j0v, colv, wpgv, d_arg, r_arg = args
        warr = context.make_array(signature.args[0])(context, builder, w_arg)
        darr = context.make_array(signature.args[4])(context, builder, d_arg)
        rarr = context.make_array(signature.args[5])(context, builder, r_arg)
        i64 = ir.IntType(64)
        n_cols = builder.extract_value(warr.shape, 1)
        fnty = ir.FunctionType(_V16I, [_V16I, _V16I, _V16I])
        dpbusd = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
        nvec, nd = VNNI_COLS // 16, VNNI_DIGITS
        accs = [
            [cgutils.alloca_once_value(builder, ir.Constant(_V16I, None)) for _ in range(nd)]
            for _ in range(nvec)
        ]
        low = ir.Constant(_V16I, [0x0F0F0F0F] * 16)
        four = ir.Constant(_V16I, [4] * 16)
        with cgutils.for_range(builder, wpgv) as loop:
            j = builder.add(j0v, loop.index)
            drow = builder.gep(darr.data, [builder.mul(j, ir.Constant(i64, 8 * nd))])  # u8 row j
            drow = builder.bitcast(drow, ir.IntType(32).as_pointer())
            xd = [
                _splat(builder, builder.load(builder.gep(drow, [ir.Constant(i64, e)]))) for e in range(2 * nd)
            ]
            for v in range(nvec):
                off = builder.add(builder.mul(j, n_cols), builder.add(colv, ir.Constant(i64, 16 * v)))
                u = builder.load(builder.bitcast(builder.gep(warr.data, [off]), _V16I.as_pointer()), align=4)
                even = builder.and_(u, low)  # byte t: q[8j + 2t]
                odd = builder.and_(builder.lshr(u, four), low)  # byte t: q[8j + 2t + 1]
                for d in range(nd):
                    acc = builder.call(dpbusd, [builder.load(accs[v][d]), even, xd[2 * d]])
                    builder.store(builder.call(dpbusd, [acc, odd, xd[2 * d + 1]]), accs[v][d])
        radix = ir.Constant(_V16F, [256.0] * 16)
        for v in range(nvec):
            t = builder.sitofp(builder.load(accs[v][0]), _V16F)  # |sum| < 2**24: exact
            for d in range(1, nd):
                t = builder.fadd(builder.fmul(t, radix), builder.sitofp(builder.load(accs[v][d]), _V16F))
            rp = builder.gep(rarr.data, [builder.add(colv, ir.Constant(i64, 16 * v))])
            builder.store(t, builder.bitcast(rp, _V16F.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, boundscheck=False)
def x_digits(x: np.ndarray, g: int, dig: np.ndarray, step: np.ndarray) -> None:
    # x (1, K) f32 -> dig (K/8, 8D) u8, step (1, K/g) f32. Bytes 4(2d + p) .. 4(2d + p) + 3 of word
    # row j hold digit d of x[8j + p], x[8j + 2 + p], x[8j + 4 + p], x[8j + 6 + p]: as dwords, the
    # lanes that line up with the nibbles of Int4Weight.words. step_g is a power of two with
    # |x / step_g| < 2**(8D - 2), so the top digit fits an int8.
    nd = VNNI_DIGITS
    for gi in range(x.shape[1] // g):
        seg = x[0, gi * g : (gi + 1) * g]
        rows = dig[gi * g // 8 : (gi + 1) * g // 8]
        top = np.float32(0.0)
        finite = True
        for i in range(g):
            a = abs(seg[i])
            if not a <= np.float32(3.4028235e38):  # inf or nan
                finite = False
            top = max(top, a)
        if not finite or top == 0.0:
            rows[:] = 0
            step[0, gi] = np.nan if not finite else 0.0  # nan: the group's outputs are nan, as in fp32
            continue
        st = math.ldexp(1.0, math.frexp(top)[1] - 8 * nd + 2)
        step[0, gi] = st
        inv = 1.0 / st  # a power of two, float64: x * inv is exact and cannot overflow
        for i in range(g):
            v = np.int32(np.rint(np.float64(seg[i]) * inv))
            row = rows[i // 8]
            lane = 4 * (i % 2) + (i % 8) // 2
            for d in range(nd - 1, -1, -1):  # least significant digit first
                digit = ((v + 128) & 255) - 128
                v = (v - digit) >> 8
                row[8 * d + lane] = np.uint8(digit & 255)


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, boundscheck=False, error_model="numpy")
def int4_gemv_vnni(
    words: np.ndarray,  # (K/8, N) u32, Int4Weight.words; N a multiple of VNNI_COLS
    s: np.ndarray,  # (K/g, N) f32
    z: np.ndarray,  # (K/g, N) f32
    sx: np.ndarray,  # (1, K/g) f32, group sums of x
    dig: np.ndarray,  # (K/8, 8D) u8 (2D dwords per word row), x_digits
    step: np.ndarray,  # (1, K/g) f32, x_digits
    acc: np.ndarray,  # (1, N) f32 scratch
    out: np.ndarray,  # (1, N) f32
    nb: int,  # columns per chunk, a multiple of VNNI_COLS
    bias: np.ndarray,  # (N,) f32 or empty
    act: int,
    residual: np.ndarray,  # (1, N) f32 or empty
) -> None:
    k8, n_cols = words.shape
    groups = s.shape[0]
    words_per_group = k8 // groups
    use_bias = bias.size > 0
    use_res = residual.size > 0
    chunks = (n_cols + nb - 1) // nb
    for c in prange(chunks):
        n0 = c * nb
        n1 = min(n_cols, n0 + nb)
        a = acc[0, n0:n1]
        o = out[0, n0:n1]
        for gi in range(groups):
            for i in range(n0, n1, VNNI_COLS):
                _vnni_dots(words, gi * words_per_group, i, words_per_group, dig, acc)  # type: ignore[call-arg]
            scale_group(o, a, s[gi, n0:n1], z[gi, n0:n1], sx[0, gi], step[0, gi], gi == 0)
        if use_bias or use_res or act != 0:
            bseg = bias[n0:n1] if use_bias else bias
            rseg = residual[0, n0:n1] if use_res else bias[0:0]
            epilogue_row(o, bseg, act, rseg, use_bias, use_res)
