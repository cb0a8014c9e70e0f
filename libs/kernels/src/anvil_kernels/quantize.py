"""Quantize float weights to ``Int4Weight`` (round-to-nearest, optional clip search) and back.

Per group of g rows along K and per column n:
    lo = min(0, min w), hi = max(0, max w)        # the range always contains 0
    scale = (hi - lo) / 15, rounded UP to the storage dtype (a degenerate all-zero group gets 1.0)
    zero  = clip(round(-lo / scale), 0, 15)       # integer, exact in every storage dtype
    q     = clip(floor(w / scale + zero + 0.5), 0, 15)
Because the stored scale is never smaller than (hi - lo) / 15, every w of the group maps into
[-0.5, 15.5] before clipping, so |dequant(q) - w| <= scale / 2 (+ float32 rounding).

Clip search (optional) shrinks the range to ``ratio * [lo, hi]`` for each ratio of a grid and keeps,
per group and column, the candidate with the smallest squared error of the dequantized values
(computed with the scale as stored). Ratio 1.0 is always a candidate and wins ties, so the
result is never worse than plain RTN.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange
from numpy.typing import NDArray

from anvil_kernels import _jit
from anvil_kernels import _validate as v
from anvil_kernels.format import Int4Weight, ScaleDType, round_up_to_storage, storage_dtype, to_f32

DEFAULT_CLIP_RATIOS: tuple[float, ...] = tuple(1.0 - 0.05 * i for i in range(11))  # 1.00 .. 0.50


@njit(parallel=True, cache=True)
def _group_min_max(w: np.ndarray, g: int, mn: np.ndarray, mx: np.ndarray) -> None:
    # w (K, N) f32 -> mn, mx (K/g, N) f32; vectorized across N (contiguous)
    groups, n = mn.shape
    for gi in prange(groups):
        lo = mn[gi]
        hi = mx[gi]
        for c in range(n):
            lo[c] = w[gi * g, c]
            hi[c] = w[gi * g, c]
        for r in range(1, g):
            row = w[gi * g + r]
            for c in range(n):
                lo[c] = min(lo[c], row[c])
                hi[c] = max(hi[c], row[c])


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True)
def _quantize_pack(w: np.ndarray, s: np.ndarray, z: np.ndarray, g: int, packed: np.ndarray) -> None:
    # w (K, N) f32, s/z (K/g, N) f32 -> packed (K/2, N) u8
    groups, n = s.shape
    half = np.float32(0.5)
    for gi in prange(groups):
        sg = s[gi]
        zg = z[gi]
        for jj in range(g // 2):
            k0 = gi * g + 2 * jj  # two K rows -> one packed row
            r0 = w[k0]
            r1 = w[k0 + 1]
            out = packed[k0 // 2]
            for c in range(n):
                q0 = min(max(np.floor(r0[c] / sg[c] + zg[c] + half), np.float32(0.0)), np.float32(15.0))
                q1 = min(max(np.floor(r1[c] / sg[c] + zg[c] + half), np.float32(0.0)), np.float32(15.0))
                out[c] = np.uint8(q0) | (np.uint8(q1) << np.uint8(4))


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True)
def _clip_errors(w: np.ndarray, s: np.ndarray, z: np.ndarray, g: int, err: np.ndarray) -> None:
    # w (K, N) f32; s, z (R, K/g, N) f32 candidates -> err (R, K/g, N) f64 sum of squared errors
    ratios, groups, n = s.shape
    half = np.float32(0.5)
    for gi in prange(groups):
        for ri in range(ratios):
            sg = s[ri, gi]
            zg = z[ri, gi]
            e = err[ri, gi]
            for c in range(n):
                e[c] = 0.0
            for r in range(g):
                row = w[gi * g + r]
                for c in range(n):
                    q = min(max(np.floor(row[c] / sg[c] + zg[c] + half), np.float32(0.0)), np.float32(15.0))
                    d = np.float64(row[c]) - np.float64((q - zg[c]) * sg[c])
                    e[c] += d * d


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True)
def _dequantize_cpu(packed: np.ndarray, s: np.ndarray, z: np.ndarray, g: int, out: np.ndarray) -> None:
    # packed (K/2, N) u8, s/z (K/g, N) f32 -> out (K, N) f32
    half_rows, n = packed.shape
    for j in prange(half_rows):
        gi = (2 * j) // g
        src = packed[j]
        sg = s[gi]
        zg = z[gi]
        o0 = out[2 * j]
        o1 = out[2 * j + 1]
        for c in range(n):
            b = src[c]
            o0[c] = (np.float32(np.uint8(b & np.uint8(15))) - zg[c]) * sg[c]
            o1[c] = (np.float32(np.uint8(b >> np.uint8(4))) - zg[c]) * sg[c]


def _scales_zeros(
    lo: NDArray[np.float64], hi: NDArray[np.float64], scale_dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """Range [lo, hi] (containing 0) -> (stored scales, stored zeros); see the module docstring."""
    span = hi - lo
    scale = np.where(span > 0.0, span / 15.0, 1.0)
    with np.errstate(over="ignore"):
        stored = round_up_to_storage(scale, scale_dtype)
    s32 = to_f32(stored, scale_dtype).astype(np.float64)
    if not np.all(np.isfinite(s32)):
        raise ValueError(
            f"weights too large for {scale_dtype} scales: (max - min) / 15 of a group overflows "
            f"{scale_dtype}; use scale_dtype='fp32'"
        )
    zero = np.clip(np.floor(-lo / s32 + 0.5), 0.0, 15.0)
    if scale_dtype == "bf16":
        return stored, _bf16_int(zero)
    return stored, zero.astype(storage_dtype(scale_dtype))


def _bf16_int(zero: NDArray[np.float64]) -> NDArray[np.uint16]:
    # integers 0..15 are exact in bfloat16: truncating the float32 pattern is exact here
    return (zero.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def quantize(
    w: np.ndarray,
    group_size: int = 128,
    scale_dtype: ScaleDType = "fp16",
    clip_search: bool = False,
    clip_ratios: Sequence[float] = DEFAULT_CLIP_RATIOS,
) -> Int4Weight:
    """Quantize a (K, N) float32/float64 weight (used as ``x @ w``) to INT4, group-wise along K.

    ``clip_search=True`` tries each ratio in ``clip_ratios`` (1.0 is always added) and keeps the one
    with the smallest MSE per group and column; plain RTN otherwise.
    """
    v.array("w", w, (np.float32, np.float64), 2)
    k, n = w.shape
    v.positive_dims("w", w.shape)
    v.group_size(group_size, k)
    storage_dtype(scale_dtype)
    if not np.all(np.isfinite(w)):
        raise ValueError("w must be finite (no NaN or inf)")
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    groups = k // group_size
    mn = np.empty((groups, n), np.float32)
    mx = np.empty((groups, n), np.float32)
    _group_min_max(w32, group_size, mn, mx)
    lo = np.minimum(mn, 0.0).astype(np.float64)
    hi = np.maximum(mx, 0.0).astype(np.float64)
    scales, zeros = _scales_zeros(lo, hi, scale_dtype)
    if clip_search:
        scales, zeros = _clip_search(w32, group_size, lo, hi, scales, zeros, scale_dtype, clip_ratios)
    packed = np.empty((k // 2, n), np.uint8)
    s32 = np.ascontiguousarray(to_f32(scales, scale_dtype))
    z32 = np.ascontiguousarray(to_f32(zeros, scale_dtype))
    _quantize_pack(w32, s32, z32, group_size, packed)
    return Int4Weight(packed, scales, zeros, int(group_size), int(k), int(n), scale_dtype)


def _clip_search(
    w32: np.ndarray,
    g: int,
    lo: NDArray[np.float64],
    hi: NDArray[np.float64],
    rtn_scales: np.ndarray,
    rtn_zeros: np.ndarray,
    scale_dtype: str,
    clip_ratios: Sequence[float],
) -> tuple[np.ndarray, np.ndarray]:
    ratios = [float(r) for r in clip_ratios if float(r) != 1.0]
    if any(not (0.0 < r < 1.0) for r in ratios):
        raise ValueError(f"clip_ratios must lie in (0, 1], got {tuple(clip_ratios)}")
    cand_s = [rtn_scales]
    cand_z = [rtn_zeros]  # ratio 1.0 first: argmin keeps it on ties
    for r in ratios:
        s, z = _scales_zeros(lo * r, hi * r, scale_dtype)
        cand_s.append(s)
        cand_z.append(z)
    s_all = np.stack(cand_s)
    z_all = np.stack(cand_z)
    err = np.empty(s_all.shape, np.float64)
    _clip_errors(
        w32,
        np.ascontiguousarray(to_f32(s_all, scale_dtype)),
        np.ascontiguousarray(to_f32(z_all, scale_dtype)),
        g,
        err,
    )
    best = np.argmin(err, axis=0)[None]  # (1, K/g, N)
    return (
        np.ascontiguousarray(np.take_along_axis(s_all, best, 0)[0]),
        np.ascontiguousarray(np.take_along_axis(z_all, best, 0)[0]),
    )


def dequantize(w: Int4Weight, out: np.ndarray | None = None) -> NDArray[np.float32]:
    """Int4Weight -> (K, N) float32, ``(q - zero) * scale`` computed in float32."""
    if not isinstance(w, Int4Weight):
        raise ValueError(f"w must be an Int4Weight, got {type(w).__name__}")
    if out is None:
        out = np.empty((w.k, w.n), np.float32)
    v.array("out", out, np.float32, 2, (w.k, w.n))
    v.writable("out", out)
    _dequantize_cpu(w.packed, w.scales_f32, w.zeros_f32, w.group_size, out)
    return out
