"""Pattern fusion: ONNX-level nodes -> Anvil kernel ops.

Kernel ops (what `codegen` and the runtimes implement, one kernel each):

| op | inputs | semantics |
|---|---|---|
| linear | x (..., K) [, residual (..., N)] | ``LN?(act(x @ W + b) + residual)``; W quantized later |
| attention | q, k, v (B, T, *) [, mask (B, T)] | per head softmax(q k^T s, key mask) v -> (B, T, heads*D) |
| layer_norm | x [, residual] | ``LN(x + residual)`` over the last dim |
| embed_ln | ids (B, T) | ``LN?(table[ids] + pos[t] + type_row)`` |
| mean_pool_l2 | x (B, T, H), mask (B, T) | masked mean over T, optional L2 normalization |
| unary | x | one activation where no linear precedes it |
| view | x | a reshape of a contiguous tensor: no kernel, same memory |

Order: GELU and LayerNorm subgraphs are recognized first, then linears (MatMul + Add + activation),
attention (`passes.attention`), Add + LayerNorm (and the linear before it), embeddings, views.
"""

from __future__ import annotations

import math

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Graph, Node
from anvil_compiler.passes.attention import fuse_attention, merge_qkv
from anvil_compiler.passes.match import Matcher

__all__ = ["KERNEL_OPS", "fuse"]

KERNEL_OPS = ("linear", "attention", "layer_norm", "embed_ln", "mean_pool_l2", "unary")
ACTS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def fuse(g: Graph) -> Graph:
    """Rewrite ``g`` in place into kernel ops; CompileError names any node left without a kernel."""
    _gelu(g)
    _layer_norm_subgraph(g)
    _linear(g)
    fuse_attention(g)
    merge_qkv(g)
    _add_layer_norm(g)
    _linear_residual(g)
    _embedding(g)
    _views_and_unary(g)
    for n in g.nodes:
        if n.op not in (*KERNEL_OPS, "view"):
            raise CompileError(
                f"op {n.op} (node {n.name!r}) is supported by the importer but no fused kernel covers it "
                f"here (inputs {n.inputs})",
                stage="fuse",
            )
    return g


def _near(v: float | None, want: float, tol: float = 1e-3) -> bool:
    return v is not None and abs(v - want) <= tol * abs(want)


def _gelu(g: Graph) -> None:
    """x * 0.5 * (1 + erf(x / sqrt 2)) in any association -> Gelu(x)."""
    for erf in [n for n in g.nodes if n.op == "Erf"]:
        m = Matcher(g)
        pre = m.producer(erf.inputs[0], ("Div", "Mul"))
        if pre is None or (sc := m.split_const(pre)) is None:
            continue
        x, c = sc
        c0 = float(c.reshape(-1)[0]) if c.size == 1 else None
        if not (_near(c0, math.sqrt(2)) if pre.op == "Div" else _near(c0, 1 / math.sqrt(2))):
            continue
        add = m.only_consumer(erf.outputs[0], "Add")
        if add is None or (sa := m.split_const(add)) is None or not _near(float(sa[1].reshape(-1)[0]), 1.0):
            continue
        mul = m.only_consumer(add.outputs[0], "Mul")
        if mul is None:
            continue
        other = mul.inputs[0] if mul.inputs[1] == add.outputs[0] else mul.inputs[1]
        last = mul
        if other == x:  # (x * (1 + erf)) * 0.5
            half = m.only_consumer(mul.outputs[0], "Mul")
            if (
                half is None
                or (sh := m.split_const(half)) is None
                or not _near(float(sh[1].reshape(-1)[0]), 0.5)
            ):
                continue
            last = half
        else:  # (x * 0.5) * (1 + erf)
            xh = m.producer(other, "Mul")
            sx = m.split_const(xh) if xh is not None else None
            if sx is None or sx[0] != x or not _near(float(sx[1].reshape(-1)[0]), 0.5):
                continue
        m.replace(last, Node("Gelu", erf.name, [x], list(last.outputs), {"approximate": "none"}))
        g.prune()


def _layer_norm_subgraph(g: Graph) -> None:
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add -> LayerNormalization."""
    for rm in [n for n in g.nodes if n.op == "ReduceMean"]:
        m = Matcher(g)
        if rm not in g.nodes:
            continue
        x = rm.inputs[0]
        subs = [n for n in m.cons.get(rm.outputs[0], []) if n.op == "Sub" and n.inputs == [x, rm.outputs[0]]]
        if len(subs) != 1:
            continue
        d = subs[0].outputs[0]
        users = m.cons.get(d, [])
        pow_ = next((n for n in users if n.op == "Pow" and m.scalar(n.inputs[1]) == 2.0), None)
        div = next((n for n in users if n.op == "Div" and n.inputs[0] == d), None)
        if pow_ is None or div is None:
            continue
        rm2 = m.only_consumer(pow_.outputs[0], "ReduceMean")
        add = m.only_consumer(rm2.outputs[0], "Add") if rm2 else None
        sqrt = m.only_consumer(add.outputs[0], "Sqrt") if add else None
        if (
            add is None
            or sqrt is None
            or div.inputs[1] != sqrt.outputs[0]
            or (eps := m.split_const(add)) is None
        ):
            continue
        mul = m.only_consumer(div.outputs[0], "Mul")
        addb = mul and m.only_consumer(mul.outputs[0], "Add")
        if not mul or not addb or (gm := m.split_const(mul)) is None or (bt := m.split_const(addb)) is None:
            continue
        h = int(g.types[x].shape[-1])
        gamma = g.add_const(f"{rm.name}.gamma", np.broadcast_to(gm[1], (h,)).astype(np.float32))
        beta = g.add_const(f"{rm.name}.beta", np.broadcast_to(bt[1], (h,)).astype(np.float32))
        new = Node(
            "LayerNormalization",
            rm.name,
            [x, gamma, beta],
            list(addb.outputs),
            {"epsilon": float(eps[1].reshape(-1)[0]), "axis": -1},
        )
        m.replace(addb, new)
        g.prune()


def _linear(g: Graph) -> None:
    """MatMul(x, W const 2-D) [+ Add bias (N,)] [+ activation] -> linear."""
    for mm in [n for n in g.nodes if n.op == "MatMul"]:
        m = Matcher(g)
        w = m.const(mm.inputs[1])
        if w is None or w.ndim != 2 or mm.inputs[0] in g.consts:
            continue
        attrs: dict[str, object] = {"weight": mm.inputs[1], "bias": None, "act": "none", "ln": None}
        last = mm
        add = m.only_consumer(last.outputs[0], "Add")
        if add is not None and (sc := m.split_const(add)) is not None and sc[1].size == w.shape[1]:
            attrs["bias"] = g.add_const(f"{mm.name}.bias", sc[1].reshape(-1).astype(np.float32))
            last = add
        act = m.only_consumer(last.outputs[0], (*ACTS, "Gelu"))
        if act is not None:
            attrs["act"] = ACTS.get(act.op) or (
                "gelu_tanh" if act.attrs.get("approximate") == "tanh" else "gelu_erf"
            )
            last = act
        m.replace(last, Node("linear", mm.name, [mm.inputs[0]], list(last.outputs), attrs))
    g.prune()


def _add_layer_norm(g: Graph) -> None:
    """LayerNormalization(Add(a, b)) -> layer_norm(a, residual=b); a plain LN -> layer_norm(x)."""
    for ln in [n for n in g.nodes if n.op == "LayerNormalization"]:
        m = Matcher(g)
        axis = int(ln.attrs.get("axis", -1))
        if axis not in (-1, len(g.types[ln.inputs[0]].shape) - 1):
            raise CompileError(f"op LayerNormalization (node {ln.name!r}) over axis {axis}", stage="fuse")
        x, gamma = ln.inputs[0], ln.inputs[1]
        beta = (
            ln.inputs[2]
            if len(ln.inputs) > 2
            else g.add_const(f"{ln.name}.beta", np.zeros_like(g.consts[gamma], dtype=np.float32))
        )
        attrs = {"gamma": gamma, "beta": beta, "eps": float(ln.attrs.get("epsilon", 1e-5))}
        add = m.producer(x, "Add")
        inputs = [x]
        if (
            add is not None
            and m.single_use(x)
            and all(i not in g.consts for i in add.inputs)
            and g.types[add.inputs[0]].shape == g.types[add.inputs[1]].shape
        ):
            inputs = list(add.inputs)
        m.replace(ln, Node("layer_norm", ln.name, inputs, list(ln.outputs), attrs))
    g.prune()


def _linear_residual(g: Graph) -> None:
    """layer_norm(linear(x), r) -> linear(x, r, ln=...); Add(linear(x), r) -> linear(x, r)."""
    for n in [n for n in g.nodes if n.op in ("layer_norm", "Add")]:
        m = Matcher(g)
        if len(n.inputs) != 2 or any(i in g.consts for i in n.inputs):
            continue
        for a, r in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            lin = m.producer(a, "linear")
            if (
                lin is None
                or not m.single_use(a)
                or len(lin.inputs) != 1
                or g.types[a].shape != g.types[r].shape
            ):
                continue
            attrs = dict(lin.attrs)
            if n.op == "layer_norm":
                attrs["ln"] = (n.attrs["gamma"], n.attrs["beta"], n.attrs["eps"])
            m.replace(n, Node("linear", lin.name, [lin.inputs[0], r], list(n.outputs), attrs))
            break
    g.prune()


def _embedding(g: Graph) -> None:
    """Gather(table, ids) [+ position rows ConstPrefix] [+ const row] [-> layer_norm] -> embed_ln."""
    for gat in [n for n in g.nodes if n.op == "Gather"]:
        m = Matcher(g)
        table = m.const(gat.inputs[0])
        if table is None or table.ndim != 2 or int(gat.attrs.get("axis", 0)) != 0:
            continue
        h = table.shape[1]
        pos = np.zeros((1, h), np.float32)
        last = gat
        while (add := m.only_consumer(last.outputs[0], "Add")) is not None:
            other = add.inputs[1] if add.inputs[0] == last.outputs[0] else add.inputs[0]
            pre = m.producer(other, "ConstPrefix")
            if other in g.consts and g.consts[other].size == h:
                pos = pos + g.consts[other].reshape(1, h)
            elif pre is not None:
                rows = g.consts[pre.inputs[0]].reshape(-1, h)  # (max positions, H): row t for token t
                pos = rows + pos
            else:
                break
            last = add
        attrs: dict[str, object] = {
            "table": gat.inputs[0],
            "pos": g.add_const(f"{gat.name}.pos", np.ascontiguousarray(pos, np.float32)),
            "ln": None,
        }
        ln = m.only_consumer(last.outputs[0], "layer_norm")
        if ln is not None and len(ln.inputs) == 1:
            attrs["ln"] = (ln.attrs["gamma"], ln.attrs["beta"], ln.attrs["eps"])
            last = ln
        m.replace(last, Node("embed_ln", gat.name, [gat.inputs[1]], list(last.outputs), attrs))
    g.prune()


def _views_and_unary(g: Graph) -> None:
    for i, n in enumerate(g.nodes):
        if n.op in VIEW_OPS:
            g.nodes[i] = Node("view", n.name, [n.inputs[0]], list(n.outputs))
        elif n.op in ACTS or n.op == "Gelu":
            act = ACTS.get(n.op) or ("gelu_tanh" if n.attrs.get("approximate") == "tanh" else "gelu_erf")
            g.nodes[i] = Node("unary", n.name, [n.inputs[0]], list(n.outputs), {"act": act})
