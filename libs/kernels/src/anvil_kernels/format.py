"""Anvil's INT4 weight format (the bit layout is documented in docs/int4.md).

A weight W of shape (K, N) is used as ``y = x @ W`` with x (M, K) -> y (M, N); K is the reduction
(input) dim, N the output dim. W is quantized group-wise along K, asymmetric:

    W[k, n] ~= (q[k, n] - zeros[k // g, n]) * scales[k // g, n],   q in 0..15

Storage:
    packed  uint8 (K/2, N)  byte packed[j, n] = q[2j, n] | (q[2j+1, n] << 4)
                            (low nibble = even k, high nibble = odd k; row-major, N contiguous)
    scales  (K/g, N)        float16, float32, or bfloat16 stored as its uint16 bit pattern
    zeros   (K/g, N)        same dtype as scales; integer-valued for Anvil's own quantizer (0..15)

Why (K/2, N): one packed row holds a pair of K rows for every output column, so the CPU kernels
stream contiguous bytes and vectorize across N with no horizontal reductions, and scales/zeros
share AWQ/GPTQ's (K/g, N) orientation, so the importers only repack nibbles.

Kernel-side copy (not a storage format): ``Int4Weight.words`` regroups the nibbles as uint32
(K/8, N), word[i, n] holding q[8i + r, n] at bits 4r (GPTQ's qweight order), built once on first
use. It lets the GEMV isolate a nibble with one AND and convert it with one int->float (q * 16**r
is exact in float32; the kernel folds 16**-r into x), where bytes need an extra widening step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from anvil_kernels import _validate as v

ScaleDType = Literal["fp16", "bf16", "fp32"]
SCALE_DTYPES: tuple[str, ...] = get_args(ScaleDType)
_STORAGE: dict[str, np.dtype] = {
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),  # numpy has no bfloat16: the raw 16-bit pattern (top half of fp32)
    "fp32": np.dtype(np.float32),
}


def storage_dtype(scale_dtype: str) -> np.dtype:
    """The numpy dtype that stores scales/zeros of ``scale_dtype``."""
    if scale_dtype not in _STORAGE:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}, got {scale_dtype!r}")
    return _STORAGE[scale_dtype]


def bf16_bits_to_f32(bits: NDArray[np.uint16]) -> NDArray[np.float32]:
    """bfloat16 bit patterns (uint16) -> float32, exact."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: NDArray[np.float32]) -> NDArray[np.uint16]:
    """float32 -> bfloat16 bit patterns, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = np.uint16(0x7FC0)
    return out


def to_f32(a: np.ndarray, scale_dtype: str) -> NDArray[np.float32]:
    """Stored scales/zeros -> float32 (exact for every storage dtype)."""
    if scale_dtype == "bf16":
        return bf16_bits_to_f32(a)
    return a.astype(np.float32)


def from_f32(a: np.ndarray, scale_dtype: str) -> np.ndarray:
    """float32/float64 values -> storage dtype, round to nearest."""
    if scale_dtype == "bf16":
        return f32_to_bf16_bits(np.asarray(a, dtype=np.float32))
    return np.asarray(a).astype(storage_dtype(scale_dtype))


def round_up_to_storage(a: NDArray[np.float64], scale_dtype: str) -> np.ndarray:
    """Positive float64 values -> storage dtype, rounded so that the stored value is >= ``a``.

    The quantizer uses this for scales: a scale that never rounds down keeps the group's range
    inside 0..15 after rounding, which is what makes the RTN error bound (<= scale/2) hold.
    """
    stored = from_f32(a.astype(np.float32), scale_dtype)
    back = to_f32(stored, scale_dtype).astype(np.float64)
    low = back < a
    if np.any(low):
        if scale_dtype == "bf16":
            stored = stored.copy()
            stored[low] += np.uint16(1)  # positive finite bf16: next pattern is the next value up
        else:
            stored = np.where(low, np.nextafter(stored, np.array(np.inf, dtype=stored.dtype)), stored)
    return stored


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A group-wise asymmetric INT4 weight of logical shape (K, N); see the module docstring.

    Construction validates every field; arrays are not copied. Treat instances as immutable:
    the float32 views of scales/zeros used by the kernels are cached on first use.
    """

    packed: NDArray[np.uint8]  # (K/2, N) two uint4 per byte along K, low nibble = even k
    scales: np.ndarray  # (K/g, N) storage dtype of scale_dtype
    zeros: np.ndarray  # (K/g, N) storage dtype of scale_dtype, dequant (q - zero) * scale
    group_size: int  # g, one of GROUP_SIZES, divides K
    k: int  # K, input (reduction) dim
    n: int  # N, output dim
    scale_dtype: ScaleDType = "fp16"

    def __post_init__(self) -> None:
        sdt = storage_dtype(self.scale_dtype)
        for name in ("k", "n"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        v.group_size(self.group_size, self.k)
        groups = self.k // self.group_size
        v.array("packed", self.packed, np.uint8, 2, (self.k // 2, self.n))
        v.array("scales", self.scales, sdt, 2, (groups, self.n))
        v.array("zeros", self.zeros, sdt, 2, (groups, self.n))
        if not np.all(np.isfinite(self.scales_f32)):
            raise ValueError("scales must be finite")
        if not np.all(np.isfinite(self.zeros_f32)):
            raise ValueError("zeros must be finite")

    @property
    def num_groups(self) -> int:
        """K / group_size."""
        return self.k // self.group_size

    @cached_property
    def scales_f32(self) -> NDArray[np.float32]:
        """(K/g, N) float32 copy of the scales, what the CPU kernels read."""
        return np.ascontiguousarray(to_f32(self.scales, self.scale_dtype))

    @cached_property
    def zeros_f32(self) -> NDArray[np.float32]:
        """(K/g, N) float32 copy of the zero points."""
        return np.ascontiguousarray(to_f32(self.zeros, self.scale_dtype))

    @cached_property
    def neg_zs_f32(self) -> NDArray[np.float32]:
        """(K/g, N) float32 -zero * scale: the tiled GEMM dequantizes (q - z) * s as one FMA,
        q * s + (-z * s)."""
        return np.ascontiguousarray(-(self.zeros_f32 * self.scales_f32))

    @cached_property
    def words(self) -> NDArray[np.uint32]:
        """(K/8, N) uint32 copy of the nibbles for the CPU GEMV (see the module docstring)."""
        return pack_words(self.packed)

    @property
    def nbytes(self) -> int:
        """Stored bytes (packed + scales + zeros)."""
        return int(self.packed.nbytes + self.scales.nbytes + self.zeros.nbytes)


def pack_nibbles(q: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """(K, N) uint8 values 0..15 -> (K/2, N) packed bytes in Anvil's layout."""
    return np.ascontiguousarray(q[0::2] | (q[1::2] << np.uint8(4)), dtype=np.uint8)


def unpack_nibbles(packed: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """(K/2, N) packed bytes -> (K, N) uint8 values 0..15."""
    kh, n = packed.shape
    q = np.empty((2 * kh, n), dtype=np.uint8)
    q[0::2] = packed & np.uint8(0x0F)
    q[1::2] = packed >> np.uint8(4)
    return q


def pack_words(packed: NDArray[np.uint8]) -> NDArray[np.uint32]:
    """(K/2, N) packed bytes, K a multiple of 8 -> (K/8, N) uint32, nibble r of word[i, n] (bits
    4r..4r+3) = q[8i + r, n]. Byte t of the word is packed row 4i + t, built with shifts, so the
    result does not depend on the host's byte order."""
    kh, n = packed.shape
    assert kh % 4 == 0, "K must be a multiple of 8"
    p = packed.reshape(kh // 4, 4, n)
    words = p[:, 0].astype(np.uint32)
    for t in range(1, 4):
        words |= p[:, t].astype(np.uint32) << np.uint32(8 * t)
    return words
