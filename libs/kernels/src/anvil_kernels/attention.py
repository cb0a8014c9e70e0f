"""Masked softmax and scaled-dot-product attention with a key-padding mask.

Mask convention (both ops): ``mask`` (B, T) marks valid keys (nonzero / True = attend). Masked
positions get probability exactly 0; a row with no valid key (or only -inf scores) outputs zeros
instead of NaN. Softmax subtracts the row max over valid keys before exp, so large logits are safe.
Padded *query* rows are computed like any other row; callers ignore them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from anvil_kernels import _jit
from anvil_kernels import _validate as chk
from anvil_kernels.workspace import Workspace


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True)
def _masked_softmax_cpu(x: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
    # x, out (B, R, T) f32; mask (B, T)
    b_size, r_size, t_size = x.shape
    for idx in prange(b_size * r_size):
        b = idx // r_size
        r = idx % r_size
        xr = x[b, r]
        o = out[b, r]
        mk = mask[b]
        mx = -np.inf
        for t in range(t_size):
            if mk[t] != 0 and xr[t] > mx:
                mx = xr[t]
        if mx == -np.inf:
            for t in range(t_size):
                o[t] = 0.0
            continue
        total = 0.0
        for t in range(t_size):
            e = math.exp(xr[t] - mx) if mk[t] != 0 else 0.0
            o[t] = e
            total += e
        inv = np.float32(1.0 / total)
        for t in range(t_size):
            o[t] *= inv


def masked_softmax(x: np.ndarray, mask: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Softmax over the last dim of x (B, ..., T) float32, keys masked by ``mask`` (B, T)
    (bool, uint8, int32 or int64; nonzero = valid). out has x's shape and must not alias x."""
    chk.array("x", x, np.float32)
    if x.ndim < 2:
        raise ValueError(f"x must be at least 2-D (B, ..., T), got shape {x.shape}")
    chk.positive_dims("x", x.shape)
    chk.array("mask", mask, chk.MASK_DTYPES, 2, (x.shape[0], x.shape[-1]))
    chk.array("out", out, np.float32, x.ndim, x.shape)
    chk.writable("out", out)
    chk.no_overlap("out", out, x=x, mask=mask)
    b, t = x.shape[0], x.shape[-1]
    _masked_softmax_cpu(x.reshape(b, -1, t), mask, out.reshape(b, -1, t))
    return out


@njit(parallel=True, fastmath=_jit.REDUCE, cache=True)
def _attention_cpu(
    q: np.ndarray,  # (B, H, T, D) f32
    k: np.ndarray,  # (B, H, T, D) f32
    val: np.ndarray,  # (B, H, T, D) f32
    mask: np.ndarray,  # (B, T)
    scale: float,
    probs: np.ndarray,  # (B*H, T) f32 scratch: one row of scores/probabilities per task
    out: np.ndarray,  # (B, H, T, D) f32
) -> None:
    b_size, h_size, t_size, d_size = q.shape
    for bh in prange(b_size * h_size):
        b = bh // h_size
        h = bh % h_size
        qb = q[b, h]
        kb = k[b, h]
        vb = val[b, h]
        ob = out[b, h]
        mk = mask[b]
        p = probs[bh]
        for i in range(t_size):
            qi = qb[i]
            oi = ob[i]
            mx = -np.inf
            for j in range(t_size):
                if mk[j] != 0:
                    kj = kb[j]
                    dot = np.float32(0.0)
                    for d in range(d_size):
                        dot += qi[d] * kj[d]
                    sc = float(dot) * scale
                    p[j] = sc
                    if sc > mx:
                        mx = sc
            for d in range(d_size):
                oi[d] = 0.0
            if mx == -np.inf:
                continue  # no valid key: zeros
            total = 0.0
            for j in range(t_size):
                if mk[j] != 0:
                    e = math.exp(p[j] - mx)
                    p[j] = e
                    total += e
            inv = 1.0 / total
            for j in range(t_size):
                if mk[j] != 0:
                    pj = np.float32(p[j] * inv)
                    vj = vb[j]
                    for d in range(d_size):
                        oi[d] += pj * vj[d]


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray,
    out: np.ndarray,
    scale: float | None = None,
    workspace: Workspace | None = None,
) -> np.ndarray:
    """``out = softmax(q k^T * scale + mask) v`` per (batch, head); q, k, v, out (B, H, T, D)
    float32 C-contiguous, mask (B, T) key validity. scale defaults to 1/sqrt(D). Returns out."""
    chk.array("q", q, np.float32, 4)
    chk.positive_dims("q", q.shape)
    chk.array("k", k, np.float32, 4, q.shape)
    chk.array("v", v, np.float32, 4, q.shape)
    b, h, t, d = q.shape
    chk.array("mask", mask, chk.MASK_DTYPES, 2, (b, t))
    chk.array("out", out, np.float32, 4, q.shape)
    chk.writable("out", out)
    chk.no_overlap("out", out, q=q, k=k, v=v, mask=mask)
    s = 1.0 / math.sqrt(d) if scale is None else chk.finite_scalar("scale", scale)
    if workspace is not None and not isinstance(workspace, Workspace):
        raise ValueError(f"workspace must be a Workspace or None, got {type(workspace).__name__}")
    ws = workspace or Workspace()
    _attention_cpu(q, k, v, mask, s, ws.get("attn.probs", (b * h, t)), out)
    return out
