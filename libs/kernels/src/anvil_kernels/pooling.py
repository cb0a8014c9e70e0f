"""Masked mean pooling over tokens, optionally L2-normalized (sentence embeddings)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from anvil_kernels import _jit
from anvil_kernels import _validate as v

L2_EPS = 1e-12  # norm floor, as torch.nn.functional.normalize: a zero vector stays zero


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True)
def _mean_pool_l2_cpu(x: np.ndarray, mask: np.ndarray, normalize: bool, out: np.ndarray) -> None:
    # x (B, T, H) f32, mask (B, T), out (B, H) f32
    b_size, t_size, h = x.shape
    for b in prange(b_size):
        o = out[b]
        for i in range(h):
            o[i] = 0.0
        count = 0
        for t in range(t_size):
            if mask[b, t] != 0:
                count += 1
                xt = x[b, t]
                for i in range(h):
                    o[i] += xt[i]
        inv = np.float32(1.0 / count) if count > 0 else np.float32(0.0)  # no valid token: zeros
        for i in range(h):
            o[i] *= inv
        if normalize:
            ss = 0.0
            for i in range(h):
                ss += np.float64(o[i]) * o[i]
            scale = np.float32(1.0 / max(np.sqrt(ss), L2_EPS))
            for i in range(h):
                o[i] *= scale


def mean_pool_l2(x: np.ndarray, mask: np.ndarray, out: np.ndarray, normalize: bool = True) -> np.ndarray:
    """Mean of x (B, T, H) float32 over the tokens where ``mask`` (B, T) is nonzero, then (if
    ``normalize``) divided by max(L2 norm, 1e-12). A row with no valid token yields zeros.
    out (B, H) float32. Returns ``out``."""
    v.array("x", x, np.float32, 3)
    v.positive_dims("x", x.shape)
    b, t, h = x.shape
    v.array("mask", mask, v.MASK_DTYPES, 2, (b, t))
    v.array("out", out, np.float32, 2, (b, h))
    v.writable("out", out)
    v.no_overlap("out", out, x=x, mask=mask)
    _mean_pool_l2_cpu(x, mask, bool(normalize), out)
    return out
