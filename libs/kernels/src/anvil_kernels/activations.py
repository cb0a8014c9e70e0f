"""Scalar activations fused into kernel epilogues (numba, inlined by LLVM into the caller's loop).

``ACTIVATIONS`` maps the public names to the integer codes the kernels branch on.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

NONE, RELU, GELU_ERF, GELU_TANH, SILU = 0, 1, 2, 3, 4
ACTIVATIONS: dict[str, int] = {
    "none": NONE,
    "relu": RELU,
    "gelu_erf": GELU_ERF,  # 0.5 x (1 + erf(x / sqrt 2)), BERT / PyTorch default
    "gelu_tanh": GELU_TANH,  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2 "gelu_new"
    "silu": SILU,  # x * sigmoid(x)
}

_INV_SQRT2 = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


@njit(cache=True)
def activate(v: float, act: int) -> float:
    """Apply activation ``act`` (a code from ACTIVATIONS) to one value, in float64 internally."""
    if act == NONE:
        return v
    if act == RELU:
        return v if v > 0.0 else 0.0
    if act == GELU_ERF:
        return 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))
    if act == GELU_TANH:
        return 0.5 * v * (1.0 + math.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))
    # SILU; exp(-v) overflows to inf for v < -709, giving -0.0, the correct limit
    return v / (1.0 + math.exp(-v))


@njit(cache=True)
def epilogue_row(
    o: np.ndarray, bias: np.ndarray, act: int, res: np.ndarray, use_bias: bool, use_res: bool
) -> None:
    """o = act(o + bias) + res over one row segment (bias/res sliced to match by the caller)."""
    for i in range(o.size):
        t = float(o[i])
        if use_bias:
            t += bias[i]
        t = activate(t, act)
        if use_res:
            t += res[i]
        o[i] = t


@njit(cache=True)
def epilogue_cols(
    out: np.ndarray, bias: np.ndarray, act: int, residual: np.ndarray, n0: int, n1: int
) -> None:
    """out[:, n0:n1] = act(out + bias) + residual for a GEMM's column chunk (bias/residual empty
    when absent); a no-op when there is nothing to apply."""
    use_bias = bias.size > 0
    use_res = residual.size > 0
    if not (use_bias or use_res or act != 0):
        return
    for m in range(out.shape[0]):
        bseg = bias[n0:n1] if use_bias else bias
        rseg = residual[m, n0:n1] if use_res else bias[0:0]
        epilogue_row(out[m, n0:n1], bseg, act, rseg, use_bias, use_res)
