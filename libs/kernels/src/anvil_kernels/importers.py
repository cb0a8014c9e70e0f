"""Import AWQ (GEMM) and GPTQ checkpoints into Anvil's INT4 format (pure numpy, load time).

AWQ:  qweight int32 (K, N/8), 8 columns per int32, nibble i (bits 4i..4i+3) holds column
      8c + AWQ_ORDER[i]; qzeros int32 (K/g, N/8) packed the same way; scales (K/g, N);
      W = (q - z) * s.
GPTQ: qweight int32 (K/8, N), nibble t of qweight[i, n] holds row 8i + t (low nibble first);
      qzeros int32 (K/g, N/8), nibble t holds column 8c + t, stored as zero - 1;
      scales (K/g, N); g_idx int32 (K,) group of each input row.
      Act-order (g_idx != k // g): rows are permuted so that each group is contiguous and the
      permutation is returned: x @ W == x[:, perm] @ dequantize(weight). A g_idx that does not
      give every group exactly g rows raises ValueError.
      The classic GPTQ packing stores zero 0 as nibble 15 (0 - 1 wraps), which reads back as 16;
      Anvil keeps it as zero = 16, matching what GPTQ kernels compute.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from anvil_kernels import _validate as v
from anvil_kernels.format import Int4Weight, ScaleDType, from_f32, pack_nibbles

AWQ_ORDER: tuple[int, ...] = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column AWQ_ORDER[i]
_AWQ_INVERSE = np.argsort(np.array(AWQ_ORDER))  # column c sits in nibble _AWQ_INVERSE[c]
_SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)  # nibble i at bits 4i .. 4i+3


def _nibbles_last(a: NDArray[np.int32]) -> NDArray[np.uint8]:
    """int32 (..., C) -> uint8 (..., C, 8): nibble i of each word in slot i."""
    u = a.view(np.uint32)[..., None]
    return ((u >> _SHIFTS) & np.uint32(0xF)).astype(np.uint8)


def _scale_dtype_of(scales: np.ndarray) -> ScaleDType:
    v.array("scales", scales, (np.float16, np.float32), 2)
    return "fp16" if scales.dtype == np.float16 else "fp32"


def from_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> Int4Weight:
    """AWQ GEMM-layout tensors -> Int4Weight (exact: dequant equals AWQ's (q - z) * s)."""
    v.array("qweight", qweight, np.int32, 2)
    k, n8 = qweight.shape
    v.positive_dims("qweight", qweight.shape)
    v.group_size(group_size, k)
    n = 8 * n8
    sdt = _scale_dtype_of(scales)
    v.array("scales", scales, scales.dtype, 2, (k // group_size, n))
    v.array("qzeros", qzeros, np.int32, 2, (k // group_size, n8))
    q = _nibbles_last(qweight)[..., _AWQ_INVERSE].reshape(k, n)
    z = _nibbles_last(qzeros)[..., _AWQ_INVERSE].reshape(k // group_size, n)
    return Int4Weight(
        pack_nibbles(q), scales.copy(), from_f32(z.astype(np.float32), sdt), int(group_size), k, n, sdt
    )


def from_gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray | None,
    group_size: int,
) -> tuple[Int4Weight, NDArray[np.int64] | None]:
    """GPTQ tensors -> (Int4Weight, perm). perm is None for the trivial g_idx (k // g), else the
    row permutation for act-order checkpoints: ``x @ W == x[:, perm] @ dequantize(weight)``."""
    v.array("qweight", qweight, np.int32, 2)
    k8, n = qweight.shape
    v.positive_dims("qweight", qweight.shape)
    k = 8 * k8
    v.group_size(group_size, k)
    groups = k // group_size
    if n % 8 != 0:
        raise ValueError(f"N={n} must be a multiple of 8 (qzeros packs 8 columns per int32)")
    sdt = _scale_dtype_of(scales)
    v.array("scales", scales, scales.dtype, 2, (groups, n))
    v.array("qzeros", qzeros, np.int32, 2, (groups, n // 8))
    # (K/8, N, 8) -> (K/8, 8, N) -> (K, N): nibble t of word i is row 8i + t
    q = _nibbles_last(qweight).transpose(0, 2, 1).reshape(k, n)
    z = _nibbles_last(qzeros).reshape(groups, n).astype(np.float32) + 1.0
    perm = None
    if g_idx is not None:
        v.array("g_idx", g_idx, (np.int32, np.int64), 1, (k,))
        trivial = np.arange(k, dtype=np.int64) // group_size
        if not np.array_equal(g_idx, trivial):
            if g_idx.min() < 0 or g_idx.max() >= groups:
                raise ValueError(f"g_idx values must lie in [0, K/g={groups})")
            counts = np.bincount(g_idx.astype(np.int64), minlength=groups)
            if np.any(counts != group_size):
                raise ValueError(
                    f"act-order g_idx must assign exactly group_size={group_size} rows to every group"
                )
            perm = np.argsort(g_idx, kind="stable").astype(np.int64)
            q = q[perm]
    weight = Int4Weight(pack_nibbles(q), scales.copy(), from_f32(z, sdt), int(group_size), k, n, sdt)
    return weight, perm
