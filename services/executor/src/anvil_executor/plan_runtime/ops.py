"""CPU implementations of the plan's op kinds, one function each, over views into the arena.

Each is the CPU twin of the CUDA kernel the compiler emits for the same op (same semantics, see
docs/compiler.md): anvil_kernels' numba ops wherever one exists, plus a small numba epilogue for
the activations anvil_kernels does not fuse (sigmoid, tanh) and for fp32 (unquantized) linears.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit, prange

from anvil_core.plan_format import ACT_CODES
from anvil_kernels import Int4Weight, Workspace, attention, embedding, int4_linear, layer_norm, mean_pool_l2
from anvil_kernels.activations import ACTIVATIONS
from anvil_kernels.linear_f32 import f32_linear

__all__ = ["ACT_CODES", "CPU_OPS", "OpState"]


@dataclass(slots=True)
class OpState:
    """One op, ready to run: its kind, attrs, weights by role, tensor indices by role."""

    kind: str
    name: str
    attrs: dict[str, Any]
    inputs: dict[str, int]
    output: int
    weights: dict[str, Any] = field(default_factory=dict)


Views = dict[str, np.ndarray]  # role -> array at the current batch shape (output under "out")


@njit(parallel=True, cache=True)
def _epilogue(o: np.ndarray, bias: np.ndarray, act: int, res: np.ndarray) -> None:
    # o (M, N) f32 in place: act(o + bias) + res; act codes as ACT_CODES
    m_rows, n = o.shape
    for m in prange(m_rows):
        for i in range(n):
            v = float(o[m, i])
            if bias.size:
                v += bias[i]
            if act == 1:
                v = v if v > 0.0 else 0.0
            elif act == 2:
                v = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
            elif act == 3:
                v = 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
            elif act == 4:
                v = v / (1.0 + math.exp(-v))
            elif act == 5:
                v = 1.0 / (1.0 + math.exp(-v))
            elif act == 6:
                v = math.tanh(v)
            if res.size:
                v += res[m, i]
            o[m, i] = v


_E1 = np.zeros(0, np.float32)
_E2 = np.zeros((0, 0), np.float32)


def linear(op: OpState, v: Views, ws: Workspace) -> None:
    """out = LN?(act(x @ W + b) + residual); any leading shape (padded (B, T) or packed rows)."""
    w = op.weights
    x = v["x"].reshape(-1, v["x"].shape[-1])
    out = v["out"].reshape(-1, v["out"].shape[-1])
    m, n = out.shape
    ln = "gamma" in w
    res = v["residual"].reshape(m, n) if "residual" in v else None
    act = str(op.attrs.get("act", "none"))
    bias = w.get("bias")
    if not isinstance(w.get("int4"), Int4Weight) and act in ACTIVATIONS and (act == "none" or not ln):
        # fp32: row blocks of BLAS sgemm with the epilogue (bias+act, or bias+residual+LN) fused
        norm = (w["gamma"], w["beta"], float(op.attrs["eps"])) if ln else None
        f32_linear(x, w["weight"], out, bias, act, res, norm, ws, w.get("weight_packed"))
        return
    target = ws.get("plan.linear", (m, n)) if ln else out
    if isinstance(w.get("int4"), Int4Weight) and act in ACTIVATIONS:
        int4_linear(x, w["int4"], target, bias, act, res, ws)
    else:
        if isinstance(w.get("int4"), Int4Weight):
            int4_linear(x, w["int4"], target, None, "none", None, ws)
        else:
            np.matmul(x, w["weight"], out=target)
        _epilogue(target, _E1 if bias is None else bias, ACT_CODES[act], _E2 if res is None else res)
    if ln:
        layer_norm(target, w["gamma"], w["beta"], float(op.attrs["eps"]), out)


def _heads(src: np.ndarray, off: int, heads: int, d: int, dst: np.ndarray) -> None:
    b, t = src.shape[0], src.shape[1]
    dst[:] = src[:, :, off : off + heads * d].reshape(b, t, heads, d).transpose(0, 2, 1, 3)


def attn(op: OpState, v: Views, ws: Workspace) -> None:
    """Per head softmax(q k^T * scale, key mask) v over (B, T, stride) sources -> (B, T, H*D)."""
    a = op.attrs
    heads, d = int(a["heads"]), int(a["head_dim"])
    b, t = v["out"].shape[0], v["out"].shape[1]
    qh, kh, vh, oh = (ws.get(f"plan.attn.{r}", (b, heads, t, d)) for r in "qkvo")
    for role, dst, j in (("q", qh, 0), ("k", kh, 1), ("v", vh, 2)):
        _heads(v[role], int(a[f"offsets{j}"]), heads, d, dst)
    mask = v["mask"] if "mask" in v else np.ones((b, t), np.uint8)
    attention(qh, kh, vh, mask, oh, float(a["scale"]), ws)
    v["out"].reshape(b, t, heads, d)[:] = oh.transpose(0, 2, 1, 3)


def embed_ln(op: OpState, v: Views, ws: Workspace) -> None:
    """out[b, t] = LN?(table[ids[b, t]] + pos[t])."""
    w = op.weights
    ids, out = v["ids"], v["out"]
    h = out.shape[-1]
    e = ws.get("plan.embed", out.shape) if "gamma" in w else out
    embedding(ids, w["table"], e)
    pos = w["pos"]
    t = ids.shape[1] if ids.ndim > 1 else 1
    e.reshape(-1, t, h)[:] += pos[:t] if pos.shape[0] > 1 else pos[0]
    if "gamma" in w:
        layer_norm(e, w["gamma"], w["beta"], float(op.attrs["eps"]), out)


def layer_norm_op(op: OpState, v: Views, ws: Workspace) -> None:
    w = op.weights
    layer_norm(v["x"], w["gamma"], w["beta"], float(op.attrs["eps"]), v["out"], v.get("residual"))


def mean_pool(op: OpState, v: Views, ws: Workspace) -> None:
    mean_pool_l2(v["x"], v["mask"], v["out"], bool(op.attrs.get("normalize", 1)))


def unary(op: OpState, v: Views, ws: Workspace) -> None:
    out = v["out"].reshape(1, -1)
    out[:] = v["x"].reshape(1, -1)
    _epilogue(out, _E1, ACT_CODES[str(op.attrs["act"])], _E2)


CPU_OPS: dict[str, Callable[[OpState, Views, Workspace], None]] = {
    "linear": linear,
    "attention": attn,
    "embed_ln": embed_ln,
    "layer_norm": layer_norm_op,
    "mean_pool_l2": mean_pool,
    "unary": unary,
}
