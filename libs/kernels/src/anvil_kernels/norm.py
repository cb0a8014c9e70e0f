"""LayerNorm over the last dim, with an optional fused residual add: out = LN(x + residual)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from anvil_kernels import _jit
from anvil_kernels import _validate as v


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True)
def _layer_norm_cpu(
    x: np.ndarray,  # (R, H) f32
    residual: np.ndarray,  # (R, H) f32 or (0, 0)
    gamma: np.ndarray,  # (H,) f32
    beta: np.ndarray,  # (H,) f32
    eps: float,
    out: np.ndarray,  # (R, H) f32
) -> None:
    rows, h = x.shape
    use_res = residual.size > 0
    inv_h = 1.0 / h
    for r in prange(rows):
        xr = x[r]
        o = out[r]
        if use_res:
            rr = residual[r]
            for i in range(h):
                o[i] = xr[i] + rr[i]  # out doubles as the buffer for x + residual
        else:
            for i in range(h):
                o[i] = xr[i]
        mean = 0.0  # two-pass mean/variance, float64 accumulators
        for i in range(h):
            mean += o[i]
        mean *= inv_h
        var = 0.0
        for i in range(h):
            d = o[i] - mean
            var += d * d
        rstd = 1.0 / np.sqrt(var * inv_h + eps)
        for i in range(h):
            o[i] = (o[i] - mean) * rstd * gamma[i] + beta[i]


def layer_norm(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,
    residual: np.ndarray | None = None,
) -> np.ndarray:
    """``out = (y - mean(y)) / sqrt(var(y) + eps) * gamma + beta`` with ``y = x (+ residual)``,
    normalized over the last dim (H). x, residual, out (..., H) float32 C-contiguous, same shape;
    gamma, beta (H,) float32; eps > 0. out must not alias the inputs. Returns ``out``."""
    v.array("x", x, np.float32)
    if x.ndim < 1:
        raise ValueError(f"x must be at least 1-D, got shape {x.shape}")
    v.positive_dims("x", x.shape)
    h = x.shape[-1]
    v.array("gamma", gamma, np.float32, 1, (h,))
    v.array("beta", beta, np.float32, 1, (h,))
    v.array("out", out, np.float32, x.ndim, x.shape)
    v.writable("out", out)
    if residual is not None:
        v.array("residual", residual, np.float32, x.ndim, x.shape)
    eps_f = v.finite_scalar("eps", eps, positive=True)
    v.no_overlap("out", out, x=x, residual=residual, gamma=gamma, beta=beta)
    return _layer_norm_cpu_2d(x, gamma, beta, eps_f, out, residual)


def _layer_norm_cpu_2d(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,
    residual: np.ndarray | None,
) -> np.ndarray:
    h = x.shape[-1]
    res2 = _jit.EMPTY2 if residual is None else residual.reshape(-1, h)
    _layer_norm_cpu(x.reshape(-1, h), res2, gamma, beta, eps, out.reshape(-1, h))
    return out
