"""CPU kernels over packed variable-length sequences (no padding): an encoder's tokens lie back to
back in (N, H) rows and ``cu`` (S + 1,) int64 holds the cumulative lengths, sequence s being rows
``cu[s]:cu[s+1]``. Linears run on all N rows at once (BLAS); only attention, position embeddings and
pooling need the sequence boundaries, and they read them from ``cu``.

Fused epilogues of a BLAS GEMM's output, one pass over memory each:
- ``bias_act``: y = act(y + bias) in place, GELU (erf form) through a rational approximation of
  erf that LLVM vectorizes (libm's erf is a scalar call: 17 ns a value, more than the GEMM itself
  for MiniLM's 384 -> 1536 layer; this one is 3.7e-7 from math.erf over all of fp32);
- ``bias_residual_layer_norm``: out = LN(y + bias + residual).

Attention over the same rows: ``varlen_attention.attention_varlen``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from anvil_kernels import _jit
from anvil_kernels import _validate as v
from anvil_kernels.activations import ACTIVATIONS

__all__ = [
    "bias_act",
    "bias_residual_layer_norm",
    "embed_ln_varlen",
    "erf_fast",
    "mean_pool_l2_varlen",
]

# erf(x) ~ x P(x^2) / Q(x^2) on [-4, 4] (|erf| rounds to 1 in fp32 beyond), fitted by iteratively
# reweighted least squares on 20,001 points (max error 3e-9 in float64, 3.7e-7 evaluated in fp32).
_P = (
    1.1283791828663001,
    0.1846421808550383,
    0.05432957883325539,
    0.0038375582692611776,
    0.0003828986325602298,
    4.787317652620794e-06,
    -1.3695023349175656e-08,
)
_Q = (
    1.0,
    0.4969684267029644,
    0.11380346548391601,
    0.015450254738413797,
    0.0013094628385824222,
    6.407477198159017e-05,
)
P0, P1, P2, P3, P4, P5, P6 = (np.float32(c) for c in _P)
Q0, Q1, Q2, Q3, Q4, Q5 = (np.float32(c) for c in _Q)


@njit(fastmath=_jit.ELEMENTWISE, cache=True, nogil=True, inline="always", error_model="numpy")
def erf_fast(x: float) -> np.float32:  # pragma: no cover (numba)
    """erf of a float32 value, branch-free (vectorizable)."""
    c = min(max(np.float32(x), np.float32(-4.0)), np.float32(4.0))
    s = c * c
    p = ((((((P6 * s + P5) * s + P4) * s + P3) * s + P2) * s + P1) * s) + P0
    q = (((((Q5 * s + Q4) * s + Q3) * s + Q2) * s + Q1) * s) + Q0
    return c * p / q


@njit(fastmath=_jit.ELEMENTWISE, cache=True, nogil=True, error_model="numpy")
def _act_row(y: np.ndarray, bias: np.ndarray, act: int) -> None:  # pragma: no cover (numba)
    """One row in place: act(y + bias) (bias of size 0: none); codes as anvil_kernels.activations."""
    half, inv_sqrt2 = np.float32(0.5), np.float32(0.7071067811865476)
    use_bias = bias.size > 0
    for i in range(y.size):
        t = y[i]
        if use_bias:
            t += bias[i]
        if act == 1:
            t = max(t, np.float32(0.0))
        elif act == 2:
            t = half * t * (np.float32(1.0) + erf_fast(t * inv_sqrt2))
        elif act == 3:
            t = half * t * (np.float32(1.0) + math.tanh(0.7978845608028654 * (t + 0.044715 * t * t * t)))
        elif act == 4:
            t = t / (np.float32(1.0) + math.exp(-t))
        y[i] = t


@njit(fastmath=_jit.REDUCE, cache=True, nogil=True, error_model="numpy")
def _ln_row(
    y: np.ndarray,
    bias: np.ndarray,
    res: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    o: np.ndarray,
) -> None:  # pragma: no cover (numba)
    h = y.size
    if bias.size:
        for i in range(h):
            y[i] += bias[i]
    if res.size:
        for i in range(h):
            y[i] += res[i]
    mean = 0.0
    for i in range(h):
        mean += y[i]
    mean /= h
    var = 0.0
    for i in range(h):
        d = y[i] - mean
        var += d * d
    rstd = np.float32(1.0 / np.sqrt(var / h + eps))
    mu = np.float32(mean)
    for i in range(h):
        o[i] = (y[i] - mu) * rstd * gamma[i] + beta[i]


@njit(parallel=True, fastmath=_jit.ELEMENTWISE, cache=True, nogil=True, error_model="numpy")
def _bias_act(y: np.ndarray, bias: np.ndarray, act: int) -> None:  # pragma: no cover (numba)
    for r in prange(y.shape[0]):
        _act_row(y[r], bias, act)


def bias_act(y: np.ndarray, bias: np.ndarray | None, act: str) -> np.ndarray:
    """``y = act(y + bias)`` in place; y (M, N) float32, bias (N,) or None, act one of
    ``ACTIVATIONS`` (gelu_erf through ``erf_fast``). Returns y."""
    v.array("y", y, np.float32, 2)
    v.writable("y", y)
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {act!r}")
    if bias is not None:
        v.array("bias", bias, np.float32, 1, (y.shape[1],))
    _bias_act(y, _jit.EMPTY1 if bias is None else bias, ACTIVATIONS[act])
    return y


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True, nogil=True, error_model="numpy")
def _bias_res_ln(
    y: np.ndarray,  # (R, H) f32, GEMM output (overwritten with y + bias + residual)
    bias: np.ndarray,  # (H,) f32 or (0,)
    res: np.ndarray,  # (R, H) f32 or (0, 0)
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,  # (R, H) f32
) -> None:  # pragma: no cover (numba)
    rows, h = y.shape
    use_bias, use_res = bias.size > 0, res.size > 0
    inv_h = 1.0 / h
    for r in prange(rows):
        yr = y[r]
        if use_bias:
            for i in range(h):
                yr[i] += bias[i]
        if use_res:
            rr = res[r]
            for i in range(h):
                yr[i] += rr[i]
        mean = 0.0  # float64 accumulators, two passes (as anvil_kernels.layer_norm)
        for i in range(h):
            mean += yr[i]
        mean *= inv_h
        var = 0.0
        for i in range(h):
            d = yr[i] - mean
            var += d * d
        rstd = np.float32(1.0 / np.sqrt(var * inv_h + eps))
        mu = np.float32(mean)
        o = out[r]
        for i in range(h):
            o[i] = (yr[i] - mu) * rstd * gamma[i] + beta[i]


def bias_residual_layer_norm(
    y: np.ndarray,
    bias: np.ndarray | None,
    residual: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,
) -> np.ndarray:
    """``out = LN(y + bias + residual)`` over the last dim; y (R, H) float32 is scratch (it holds
    y + bias + residual afterwards); residual (R, H) may be ``out`` itself. Returns out."""
    v.array("y", y, np.float32, 2)
    v.writable("y", y)
    r, h = y.shape
    v.array("out", out, np.float32, 2, (r, h))
    v.writable("out", out)
    v.array("gamma", gamma, np.float32, 1, (h,))
    v.array("beta", beta, np.float32, 1, (h,))
    if bias is not None:
        v.array("bias", bias, np.float32, 1, (h,))
    if residual is not None:
        v.array("residual", residual, np.float32, 2, (r, h))
    v.no_overlap("out", out, y=y)
    eps_f = v.finite_scalar("eps", eps, positive=True)
    _bias_res_ln(
        y,
        _jit.EMPTY1 if bias is None else bias,
        _jit.EMPTY2 if residual is None else residual,
        gamma,
        beta,
        eps_f,
        out,
    )
    return out


def _check_cu(cu: np.ndarray, rows: int) -> int:
    v.array("cu", cu, np.int64, 1)
    if cu.size < 2 or int(cu[0]) != 0 or int(cu[-1]) != rows or bool(np.any(np.diff(cu) < 1)):
        raise ValueError(f"cu must rise strictly from 0 to {rows} (rows), got {cu.tolist()[:8]}...")
    return int(cu.size - 1)


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True, nogil=True, error_model="numpy")
def _embed_ln(
    ids: np.ndarray,  # (N,) int
    cu: np.ndarray,  # (S+1,) int64
    table: np.ndarray,  # (V, H) f32
    pos: np.ndarray,  # (P, H) f32
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,  # (N, H) f32
) -> None:  # pragma: no cover (numba)
    h = out.shape[1]
    n_seq = cu.size - 1
    inv_h = 1.0 / h
    for s in prange(n_seq):
        for r in range(cu[s], cu[s + 1]):
            src = table[ids[r]]
            p = pos[r - cu[s]]
            o = out[r]
            mean = 0.0
            for i in range(h):
                o[i] = src[i] + p[i]
                mean += o[i]
            mean *= inv_h
            var = 0.0
            for i in range(h):
                d = o[i] - mean
                var += d * d
            rstd = np.float32(1.0 / np.sqrt(var * inv_h + eps))
            mu = np.float32(mean)
            for i in range(h):
                o[i] = (o[i] - mu) * rstd * gamma[i] + beta[i]


def embed_ln_varlen(
    ids: np.ndarray,
    cu: np.ndarray,
    table: np.ndarray,
    pos: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    out: np.ndarray,
) -> np.ndarray:
    """``out[r] = LN(table[ids[r]] + pos[r - cu[s]])`` for the rows r of each sequence s.
    ids (N,) int32/int64 in [0, V); table (V, H), pos (P, H) float32 with P >= the longest
    sequence; out (N, H) float32. Returns out."""
    v.array("ids", ids, v.INDEX_DTYPES, 1)
    v.array("table", table, np.float32, 2)
    vocab, h = table.shape
    v.array("pos", pos, np.float32, 2)
    v.array("out", out, np.float32, 2, (ids.size, h))
    v.writable("out", out)
    v.array("gamma", gamma, np.float32, 1, (h,))
    v.array("beta", beta, np.float32, 1, (h,))
    _check_cu(cu, ids.size)
    longest = int(np.diff(cu).max())
    if pos.shape != (pos.shape[0], h) or pos.shape[0] < longest:
        raise ValueError(f"pos must be (P >= {longest}, {h}), got {pos.shape}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"ids must lie in [0, V={vocab}), got min {int(ids.min())}, max {int(ids.max())}")
    _embed_ln(ids, cu, table, pos, gamma, beta, v.finite_scalar("eps", eps, positive=True), out)
    return out


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True, nogil=True, error_model="numpy")
def _mean_pool_varlen(x: np.ndarray, cu: np.ndarray, normalize: bool, out: np.ndarray) -> None:
    n_seq = cu.size - 1
    h = x.shape[1]
    for s in prange(n_seq):
        o = out[s]
        acc = np.zeros(h, np.float64)
        for r in range(cu[s], cu[s + 1]):
            for i in range(h):
                acc[i] += x[r, i]
        inv = 1.0 / (cu[s + 1] - cu[s])
        ss = 0.0
        for i in range(h):
            acc[i] *= inv
            ss += acc[i] * acc[i]
        scale = 1.0 / max(np.sqrt(ss), 1e-12) if normalize else 1.0
        for i in range(h):
            o[i] = acc[i] * scale


def mean_pool_l2_varlen(x: np.ndarray, cu: np.ndarray, out: np.ndarray, normalize: bool = True) -> np.ndarray:
    """Mean of each sequence's rows of x (N, H) float32, then (if ``normalize``) divided by
    max(L2 norm, 1e-12); out (S, H) float32. Returns out."""
    v.array("x", x, np.float32, 2)
    n_seq = _check_cu(cu, x.shape[0])
    v.array("out", out, np.float32, 2, (n_seq, x.shape[1]))
    v.writable("out", out)
    v.no_overlap("out", out, x=x)
    _mean_pool_varlen(x, cu, bool(normalize), out)
    return out
