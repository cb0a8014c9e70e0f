"""The compiler's one evaluator of a fused graph: a numpy twin of the kernel ops.

Used by GPTQ calibration (`calibrate.py`, node by node, to collect each linear's inputs) and by the
accuracy report (`accuracy.py`, whole graphs with chosen weights). LayerNorm, attention and pooling
are anvil_kernels' own (what the executor runs); matmuls are numpy on fp32 weights (an INT4 linear
runs on its dequantized weight, which `int4_linear` matches to ~1e-6 relative, docs/int4.md);
activations numpy (GELU-erf through a 1.5e-7 erf approximation).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Graph, Node
from anvil_kernels import attention, layer_norm, mean_pool_l2

__all__ = ["Forward", "activation", "run_graph"]


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def activation(y: np.ndarray, act: str) -> np.ndarray:
    if act == "none":
        return y
    if act == "gelu_erf":
        return 0.5 * y * (1.0 + _erf(y * 0.7071067811865476))
    if act == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
    if act == "relu":
        return np.maximum(y, 0.0)
    if act == "silu":
        return y / (1.0 + np.exp(-y))
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if act == "tanh":
        return np.tanh(y)
    raise CompileError(f"graph evaluation: activation {act!r} unknown", stage="quantize")


def _ln(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    return layer_norm(x, gamma.reshape(-1), beta.reshape(-1), eps, np.empty_like(x))


class Forward:
    """Runs one kernel op of ``g`` on one batch's tensors (``env``: value name -> array).

    ``consts`` overrides constants of ``g`` by name (e.g. an embedding table rounded to fp16, as
    the quantized plan stores it)."""

    def __init__(self, g: Graph, consts: Mapping[str, np.ndarray] | None = None) -> None:
        self.g = g
        self.consts = consts or {}

    def c(self, name: str) -> np.ndarray:
        return np.asarray(self.consts.get(name, self.g.consts[name]), np.float32)

    def linear(self, n: Node, env: dict[str, np.ndarray], w: np.ndarray) -> np.ndarray:
        x = env[n.inputs[0]]
        y = x.reshape(-1, x.shape[-1]) @ w  # (rows, N) f32
        if n.attrs.get("bias"):
            y += self.c(n.attrs["bias"]).reshape(-1)
        y = activation(y, str(n.attrs.get("act", "none"))).reshape(*x.shape[:-1], w.shape[1])
        if len(n.inputs) > 1:
            y = y + env[n.inputs[1]]
        if n.attrs.get("ln"):
            gm, bt, eps = n.attrs["ln"]
            y = _ln(y, self.c(gm), self.c(bt), float(eps))
        return y.astype(np.float32)

    def run(self, n: Node, env: dict[str, np.ndarray], b: int, t: int) -> np.ndarray:
        a = n.attrs
        if n.op == "linear":
            return self.linear(n, env, self.c(a["weight"]))
        if n.op == "view":
            return env[n.inputs[0]].reshape([d.eval(b, t) for d in self.g.types[n.outputs[0]].shape])
        if n.op == "embed_ln":
            pos = self.c(a["pos"])
            e = self.c(a["table"])[env[n.inputs[0]]] + (pos[:t] if pos.shape[0] > 1 else pos[0])
            return _ln(e, self.c(a["ln"][0]), self.c(a["ln"][1]), float(a["ln"][2])) if a.get("ln") else e
        if n.op == "layer_norm":
            x = env[n.inputs[0]] + (env[n.inputs[1]] if len(n.inputs) > 1 else 0.0)
            return _ln(x, self.c(a["gamma"]), self.c(a["beta"]), float(a["eps"]))
        if n.op == "attention":
            h, d = int(a["heads"]), int(a["head_dim"])
            q, k, v = (
                np.ascontiguousarray(
                    env[n.inputs[j]][..., a["offsets"][j] : a["offsets"][j] + h * d]
                    .reshape(b, t, h, d)
                    .transpose(0, 2, 1, 3),
                    np.float32,
                )
                for j in range(3)
            )
            mask = env[n.inputs[3]] if len(n.inputs) > 3 else np.ones((b, t), np.uint8)
            o = attention(q, k, v, mask, np.empty_like(q), float(a["scale"]))  # (B, H, T, D)
            return o.transpose(0, 2, 1, 3).reshape(b, t, h * d)
        if n.op == "mean_pool_l2":
            x = np.ascontiguousarray(env[n.inputs[0]], np.float32)  # (B, T, H)
            out = np.empty((x.shape[0], x.shape[2]), np.float32)
            return mean_pool_l2(x, env[n.inputs[1]], out, bool(a.get("normalize", True)))
        if n.op == "unary":
            return activation(env[n.inputs[0]], str(a["act"])).astype(np.float32)
        raise CompileError(f"graph evaluation: op {n.op} (node {n.name!r}) cannot run here", stage="quantize")


def run_graph(
    g: Graph,
    feeds: dict[str, np.ndarray],
    linear_weights: Mapping[str, np.ndarray],
    consts: Mapping[str, np.ndarray] | None = None,
    start: int = 0,
    values: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Every value of fused graph ``g`` on one batch ``feeds`` (inputs (B, ...) or (B, T, ...)),
    by name; the graph outputs under their public names too. ``linear_weights`` gives the fp32
    (K, N) weight a linear node runs with, by node name (the dequantized INT4 weight of a quantized
    one); other linears use their graph constant. ``start``/``values``: resume at node ``start``
    from the values of an earlier run (they are read, not modified)."""
    b = feeds[g.inputs[0]].shape[0]
    t = next((feeds[x].shape[1] for x in g.inputs if any(d.t for d in g.types[x].shape)), 1)
    fwd = Forward(g, consts)
    env = dict(values) if values is not None else dict(feeds)
    for n in g.nodes[start:]:
        if n.op == "linear" and n.name in linear_weights:
            env[n.outputs[0]] = fwd.linear(n, env, linear_weights[n.name])
        else:
            env[n.outputs[0]] = fwd.run(n, env, b, t)
    env.update({p: env[o] for o, p in g.public.items() if o in env})
    return env
