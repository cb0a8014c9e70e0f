"""Attention fusion: the BERT self-attention subgraph -> one ``attention`` op, then Q/K/V merge.

Recognized (as ``torch.onnx.export`` writes HF-style attention):

    q = Transpose[0,2,1,3](Reshape(q_src (B,T,H) -> (B,T,nh,D)))       k likewise, perm [0,2,3,1]
    s = MatMul(q, k) [/ c | * c] [+ mask_bias]  -> Softmax(-1) -> MatMul(., v) -> Transpose -> Reshape

The mask bias must come from one graph input through elementwise nodes; it is checked numerically
(valid key -> ~0, padded key -> <= -1e4), so the fused op's key-padding semantics are exact.
"""

from __future__ import annotations

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim, Graph, Node, TensorType
from anvil_compiler.passes.fold import evaluate
from anvil_compiler.passes.match import Matcher

__all__ = ["fuse_attention", "merge_qkv"]

Q_PERM, K_PERM = [0, 2, 1, 3], [0, 2, 3, 1]


def _heads(m: Matcher, name: str) -> tuple[str, list[int], int, int] | None:
    """Walk back through Transposes to the (B,T,H) -> (B,T,nh,D) Reshape: (source, perm, nh, D)."""
    perm = [0, 1, 2, 3]
    cur = name
    while (t := m.producer(cur, "Transpose")) is not None:
        p = list(t.attrs["perm"])
        perm = [p[i] for i in perm]
        cur = t.inputs[0]
    r = m.producer(cur, "Reshape")
    if r is None:
        return None
    src, out = m.g.types[r.inputs[0]].shape, m.g.types[cur].shape
    if len(src) != 3 or len(out) != 4 or src[:2] != out[:2] or out[2] * out[3] != src[2]:
        return None
    return r.inputs[0], perm, int(out[2]), int(out[3])


def _mask_source(g: Graph, m: Matcher, bias: str, where: str) -> str:
    """The graph input the additive mask comes from, after checking it is a key-padding mask."""
    chain: list[Node] = []
    cur = bias
    while cur not in g.inputs:
        n = m.producer(cur)
        var = [i for i in (n.inputs if n else []) if i not in g.consts]
        if n is None or len(var) != 1:
            raise CompileError(
                f"{where}: the attention mask does not derive from one model input", stage="fuse"
            )
        chain.append(n)
        cur = var[0]
    probe = np.array([[1, 0]], dtype=np.dtype(g.types[cur].dtype))
    values: dict[str, np.ndarray] = {cur: probe}
    for n in reversed(chain):
        ins = [values[i] if i in values else g.consts[i] for i in n.inputs]
        values[n.outputs[0]] = evaluate(n.op, n.name, ins, n.attrs)
    got = values[bias].reshape(-1)
    if got.size != 2 or abs(float(got[0])) > 1e-6 or float(got[1]) > -1e4:
        raise CompileError(
            f"{where}: the attention mask is not a key-padding mask (probe gave {got})", stage="fuse"
        )
    return cur


def fuse_attention(g: Graph) -> None:
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        m = Matcher(g)
        where = f"op Softmax (node {sm.name!r})"
        if int(sm.attrs.get("axis", -1)) not in (-1, len(g.types[sm.inputs[0]].shape) - 1):
            raise CompileError(f"{where}: softmax over a non-last axis", stage="fuse")
        x, mask = sm.inputs[0], None
        add = m.producer(x, "Add")
        if add is not None and all(i not in g.consts for i in add.inputs):
            shp = g.types[x].shape
            x, bias = add.inputs if g.types[add.inputs[0]].shape == shp else add.inputs[::-1]
            mask = _mask_source(g, m, bias, where)
        scale = 1.0
        sc = m.producer(x, ("Div", "Mul"))
        if sc is not None and (c := m.split_const(sc)) is not None and c[1].size == 1:
            factor = float(c[1].reshape(-1)[0])
            scale, x = (1.0 / factor if sc.op == "Div" else factor), c[0]
        mm = m.producer(x, "MatMul")
        pv = m.only_consumer(sm.outputs[0], "MatMul")
        if mm is None or pv is None or pv.inputs[0] != sm.outputs[0]:
            raise CompileError(f"{where}: softmax outside a recognized attention pattern", stage="fuse")
        q, k, v = _heads(m, mm.inputs[0]), _heads(m, mm.inputs[1]), _heads(m, pv.inputs[1])
        if q is None or k is None or v is None or q[1] != Q_PERM or k[1] != K_PERM or v[1] != Q_PERM:
            raise CompileError(f"{where}: Q/K/V head layout not recognized", stage="fuse")
        tr = m.only_consumer(pv.outputs[0], "Transpose")
        rs = tr and list(tr.attrs["perm"]) == Q_PERM and m.only_consumer(tr.outputs[0], "Reshape")
        if not rs or len(g.types[rs.outputs[0]].shape) != 3:
            raise CompileError(f"{where}: attention output is not merged back to (B, T, H)", stage="fuse")
        heads, d = q[2], q[3]
        attrs = {
            "heads": heads,
            "head_dim": d,
            "scale": scale,
            "offsets": [0, 0, 0],
            "strides": [heads * d] * 3,
            "has_mask": mask is not None,
        }
        ins = [q[0], k[0], v[0]] + ([mask] if mask else [])
        m.replace(rs, Node("attention", sm.name, ins, list(rs.outputs), attrs))
        g.prune()


def merge_qkv(g: Graph) -> None:
    """Three plain linears of one input feeding one attention -> one linear of N = 3H."""
    for att in [n for n in g.nodes if n.op == "attention"]:
        m = Matcher(g)
        lins = [m.producer(i, "linear") for i in att.inputs[:3]]
        if any(n is None for n in lins) or len({id(n) for n in lins}) != 3:
            continue
        found = [n for n in lins if n is not None]
        if len(found) != 3:
            continue
        ql = found[0]
        plain = all(n.attrs["act"] == "none" and n.attrs["ln"] is None and len(n.inputs) == 1 for n in found)
        if (
            not plain
            or len({n.inputs[0] for n in found}) != 1
            or not all(m.single_use(n.outputs[0]) for n in found)
        ):
            continue
        lins = found  # type: ignore[assignment]
        ws = [g.consts[n.attrs["weight"]] for n in lins]  # type: ignore[union-attr,index]
        h = ws[0].shape[1]
        bs = [g.consts[n.attrs["bias"]] if n.attrs["bias"] else np.zeros(h, np.float32) for n in lins]  # type: ignore[union-attr,index]
        name = f"{ql.name}.qkv"
        w = g.add_const(f"{name}.weight", np.ascontiguousarray(np.concatenate(ws, axis=1)))
        b = g.add_const(f"{name}.bias", np.concatenate(bs).astype(np.float32))
        out = f"{name}.out"
        shape = g.types[ql.outputs[0]].shape
        g.types[out] = TensorType("float32", (*shape[:-1], Dim(3 * h)))
        first = min(g.nodes.index(n) for n in lins)  # type: ignore[arg-type]
        g.nodes.insert(
            first,
            Node("linear", name, [ql.inputs[0]], [out], {"weight": w, "bias": b, "act": "none", "ln": None}),
        )
        att.inputs[:3] = [out, out, out]
        att.attrs["offsets"] = [0, h, 2 * h]
        att.attrs["strides"] = [3 * h] * 3
        g.prune()
