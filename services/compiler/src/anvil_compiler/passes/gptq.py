"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers") for one linear weight, into Anvil's INT4 format (`anvil_kernels.format`).

For y = x @ W with W (K, N), the layer's output error on calibration inputs X (M, K) is
``||X (W - Q)||^2 = tr((W - Q)^T H (W - Q)) / 2`` with H = 2 X^T X (K, K), so each column of W is an
independent least-squares problem with the same H. GPTQ quantizes the K rows of W one at a time
(the paper's "columns": it stores W as (N, K)) and spreads each row's rounding error over the rows
not quantized yet, in the direction that H says compensates it best:

    U = upper Cholesky factor of (H + damp I)^-1          # (K, K), H^-1 = U^T U
    for k in 0..K-1:
        q_k = quant(w_k)                                  # RTN with the group's scale/zero
        e_k = (w_k - q_k) / U[k, k]                       # (N,)
        w_j -= U[k, j] * e_k   for j > k                  # error feedback

The updates are applied lazily per block of rows (one GEMM per block). The scale and zero of a group
are computed when the pass reaches its first row, from the rows as updated by then (so they see
the error feedback), with the quantizer's rules: range containing 0, scale rounded up to fp16,
integer zero. ``clip_search`` also tries shrunken ranges per group and keeps the one with the
smallest diag(H)-weighted error. ``act_order`` optional (see `gptq_quantize`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from anvil_kernels import Int4Weight
from anvil_kernels.format import round_up_to_storage, to_f32
from anvil_kernels.quantize import DEFAULT_CLIP_RATIOS

__all__ = ["DAMP", "gptq_quantize"]

DAMP = 0.01  # dampening, fraction of mean(diag H) added to the diagonal (the paper's default)
BLOCK_ROWS = 128  # rows per lazy batch update (at least one group)


def _params(w: NDArray[np.float64], ratio: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Rows (g, N) -> (scale, zero) (N,) as stored (fp16 scale rounded up, integer zero 0..15)."""
    lo = np.minimum(w.min(0), 0.0) * ratio
    hi = np.maximum(w.max(0), 0.0) * ratio
    span = hi - lo
    scale = to_f32(round_up_to_storage(np.where(span > 0.0, span / 15.0, 1.0), "fp16"), "fp16")
    if not np.all(np.isfinite(scale)):
        raise ValueError("weights too large for fp16 scales: (max - min) / 15 of a group overflows")
    s = scale.astype(np.float64)
    return s, np.clip(np.floor(-lo / s + 0.5), 0.0, 15.0)


def _quant(w: NDArray[np.float64], s: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    # the kernels' rounding (anvil_kernels.quantize): floor(w / s + z + 1/2), clipped to 0..15
    return np.clip(np.floor(w / s + z + 0.5), 0.0, 15.0)


def _group_params(
    w: NDArray[np.float64], hdiag: NDArray[np.float64], clip_search: bool
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    s, z = _params(w, 1.0)
    if not clip_search:
        return s, z
    best = (((w - (_quant(w, s, z) - z) * s) ** 2) * hdiag[:, None]).sum(0)
    for r in DEFAULT_CLIP_RATIOS:
        if r == 1.0:
            continue
        s2, z2 = _params(w, r)
        err = (((w - (_quant(w, s2, z2) - z2) * s2) ** 2) * hdiag[:, None]).sum(0)
        better = err < best  # ratio 1.0 wins ties
        s, z, best = np.where(better, s2, s), np.where(better, z2, z), np.where(better, err, best)
    return s, z


def gptq_quantize(
    w: np.ndarray,
    h: np.ndarray,
    group_size: int,
    clip_search: bool = False,
    act_order: bool = False,
    damp: float = DAMP,
) -> Int4Weight:
    """Quantize ``w`` (K, N), used as ``x @ w``, to INT4 (fp16 scales/zeros, groups of
    ``group_size`` along K) minimizing the output error on inputs with ``h`` = X^T X (K, K), the
    sum over calibration rows (any positive multiple gives the same result).

    ``act_order``: take rows in order of decreasing diag(H) (input energy) instead; the groups
    stay contiguous along K in the stored format, so their scales/zeros are fixed up front from
    the unmodified weights ("static groups")."""
    k, n = w.shape
    if h.shape != (k, k):
        raise ValueError(f"h must be ({k}, {k}) for w of shape {w.shape}, got {h.shape}")
    if k % group_size or group_size % 2:
        raise ValueError(f"group_size {group_size} must be even and divide K = {k}")
    wq = np.array(w, dtype=np.float64)  # (K, N), updated in place by the error feedback
    hh = np.array(h, dtype=np.float64)
    dead = np.diag(hh) == 0.0  # inputs that are always 0: their rows do not matter, quantize 0
    hh[dead, dead] = 1.0
    wq[dead] = 0.0
    hdiag = np.diag(hh).copy()
    hh[np.diag_indices(k)] += damp * float(np.mean(hdiag))
    q = np.empty((k, n), np.uint8)
    groups = k // group_size
    scales = np.empty((groups, n), np.float64)
    zeros = np.empty((groups, n), np.float64)
    perm = np.arange(k)
    if act_order:
        for gi in range(groups):
            rows = slice(gi * group_size, (gi + 1) * group_size)
            scales[gi], zeros[gi] = _group_params(wq[rows], hdiag[rows], clip_search)
        perm = np.argsort(-hdiag, kind="stable")
        wq, hh = wq[perm], hh[perm][:, perm]
    u = np.linalg.cholesky(np.linalg.inv(hh)).T  # (K, K) upper, H^-1 = U^T U
    block = max(BLOCK_ROWS, group_size)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb = wq[b0:b1]  # view: (rows, N)
        err = np.zeros((b1 - b0, n), np.float64)
        for i in range(b1 - b0):
            r = b0 + i
            gi = perm[r] // group_size
            if not act_order and r % group_size == 0:
                scales[gi], zeros[gi] = _group_params(
                    wb[i : i + group_size], hdiag[r : r + group_size], clip_search
                )
            s, z = scales[gi], zeros[gi]
            qr = _quant(wb[i], s, z)
            q[perm[r]] = qr
            e = (wb[i] - (qr - z) * s) / u[r, r]  # (N,)
            wb[i + 1 :] -= u[r, r + 1 : b1, None] * e[None, :]
            err[i] = e
        wq[b1:] -= u[b0:b1, b1:].T @ err  # lazy update of the rows after the block
    packed = q[0::2] | (q[1::2] << 4)  # (K/2, N): low nibble = even k
    return Int4Weight(
        np.ascontiguousarray(packed, np.uint8),
        scales.astype(np.float16),
        zeros.astype(np.float16),
        group_size,
        k,
        n,
        "fp16",
    )
