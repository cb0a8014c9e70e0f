"""ONNX (opset >= 13) -> `ir.Graph`, folding constants and shape arithmetic on the way.

Graph inputs' symbolic dims become the symbols B (axis 0) and T (axis 1). Every node whose inputs
are all known is evaluated (`passes.fold`); the rest become IR nodes with inferred types. A slice of
a constant whose end is symbolic (``position_ids[:, :T]``) becomes a ``ConstPrefix`` node, and a
Gather from a constant table through it folds into another ``ConstPrefix``: that is how BERT's
position embeddings stay a constant table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.shapes import INFER, Value
from anvil_compiler.ir import Dim, Graph, Node, TensorType
from anvil_compiler.passes.fold import FOLDABLE, evaluate, normalize

__all__ = ["MIN_OPSET", "load_onnx"]

MIN_OPSET = 13
KSERVE = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}


def load_onnx(data: bytes | Path, name: str = "model") -> Graph:
    """Parse and import an ONNX model. Raises CompileError on a truncated file, an old opset, an op
    the compiler does not know (naming op and node), or inconsistent shapes."""
    import onnx
    from google.protobuf.message import DecodeError

    raw = data.read_bytes() if isinstance(data, Path) else data
    try:
        model = onnx.load_model_from_string(raw)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise CompileError(f"cannot parse the ONNX file ({len(raw)} bytes): {exc}", stage="load") from exc
    if not model.graph.node:
        raise CompileError("the ONNX file holds no graph nodes (truncated or empty)", stage="load")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:
        raise CompileError(f"ONNX opset {opset} is below the supported minimum {MIN_OPSET}", stage="load")
    return _Importer(model, name).run()


class _Importer:
    def __init__(self, model: Any, name: str) -> None:
        self.model = model
        self.g = Graph(name=name)
        self.symbols: dict[str, Dim] = {}
        self.alias: dict[str, str] = {}

    def value(self, name: str) -> Value:
        name = self.alias.get(name, name)
        if name in self.g.consts:
            return self.g.consts[name]
        if name in self.g.types:
            return self.g.types[name]
        raise CompileError(f"value {name!r} is used before it is defined", stage="import")

    def run(self) -> Graph:
        from onnx import helper, numpy_helper

        g, graph = self.g, self.model.graph
        for init in graph.initializer:
            g.consts[init.name] = numpy_helper.to_array(init)
        for vi in graph.input:
            if vi.name in g.consts:
                continue
            tt = vi.type.tensor_type
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            shape = tuple(self._dim(d, axis, vi.name) for axis, d in enumerate(tt.shape.dim))
            g.types[vi.name] = TensorType(str(dtype), shape)
            g.inputs.append(vi.name)
            g.io_datatypes[vi.name] = KSERVE.get(str(dtype), "FP32")
        for n in graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            self.node(n.op_type, n.name or n.output[0], list(n.input), list(n.output), attrs)
        for vo in graph.output:
            src = self.alias.get(vo.name, vo.name)
            if src not in g.types:
                raise CompileError(f"graph output {vo.name!r} is a constant", stage="import")
            g.outputs.append(src)
            g.io_datatypes[src] = KSERVE.get(g.types[src].dtype, "FP32")
            g.public[src] = vo.name
        g.prune()
        return g

    def _dim(self, d: Any, axis: int, tensor: str) -> Dim:
        if d.HasField("dim_value"):
            return Dim(int(d.dim_value))
        key = d.dim_param or f"{tensor}:{axis}"
        if key not in self.symbols:
            if axis > 1:
                raise CompileError(
                    f"input {tensor!r}: symbolic dim {key!r} at axis {axis}; only axis 0 (batch) and "
                    "axis 1 (sequence) may be symbolic",
                    stage="import",
                )
            self.symbols[key] = Dim(1, b=1) if axis == 0 else Dim(1, t=1)
        return self.symbols[key]

    def node(self, op: str, name: str, inputs: list[str], outputs: list[str], attrs: dict[str, Any]) -> None:
        g = self.g
        if op == "Constant":
            from onnx import numpy_helper

            if "value" in attrs:
                g.consts[outputs[0]] = numpy_helper.to_array(attrs["value"])
            else:
                key = next(iter(attrs))
                g.consts[outputs[0]] = np.asarray(attrs[key])
            return
        ins: list[Value | None] = [self.value(i) if i else None for i in inputs]
        where = f"op {op} (node {name!r})"
        if op == "Shape":
            t = ins[0]
            shape = list(t.shape) if isinstance(t, TensorType) else list(np.asarray(t).shape)
            s, e = attrs.get("start", 0), attrs.get("end", len(shape))
            arr = np.empty(len(shape[s:e]), dtype=object)
            arr[:] = shape[s:e]
            g.consts[outputs[0]] = normalize(arr)
            return
        if op in FOLDABLE and all(v is None or isinstance(v, np.ndarray) for v in ins):
            try:
                g.consts[outputs[0]] = evaluate(op, name, [v for v in ins], attrs)  # type: ignore[misc]
                return
            except CompileError:
                if op != "Slice":
                    raise
                return self._const_prefix(name, ins, outputs[0], where)
        if op == "Identity":
            self.alias[outputs[0]] = self.alias.get(inputs[0], inputs[0])
            return
        if (
            op == "Gather"
            and isinstance(ins[0], np.ndarray)
            and self._prefix_gather(name, inputs, ins, outputs, attrs)
        ):
            return
        if op == "Gemm":
            return self._gemm(name, inputs, ins, outputs, attrs, where)
        rule = INFER.get(op)
        if rule is None:
            raise CompileError(f"unsupported op {op} (node {name!r})", stage="import")
        real = [v for v in ins if v is not None]
        g.types[outputs[0]] = rule(real, attrs, where)
        names = [self._materialize(i, v) for i, v in zip(inputs, ins, strict=True) if v is not None]
        g.nodes.append(Node(op, name, names, [outputs[0]], attrs))

    def _materialize(self, name: str, v: Value) -> str:
        return self.alias.get(name, name)

    def _const_prefix(self, name: str, ins: list[Value | None], out: str, where: str) -> None:
        """Slice(const, 0, T) along one axis: a run-time view of a constant's first T rows."""
        data, starts, ends = ins[0], ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 and ins[3] is not None else None
        assert (
            isinstance(data, np.ndarray) and isinstance(starts, np.ndarray) and isinstance(ends, np.ndarray)
        )
        ax = [int(a) for a in axes.reshape(-1)] if isinstance(axes, np.ndarray) else list(range(ends.size))
        if ends.size != 1 or int(starts.reshape(-1)[0]) != 0 or not isinstance(ends.reshape(-1)[0], Dim):
            raise CompileError(
                f"{where}: slice with symbolic bounds is only supported as x[:T]", stage="import"
            )
        axis = ax[0] % data.ndim
        cname = self.g.add_const(f"{name}.table", data)
        shape = tuple(Dim(int(s)) for s in data.shape)
        shape = (*shape[:axis], ends.reshape(-1)[0], *shape[axis + 1 :])
        self.g.types[out] = TensorType(str(data.dtype), shape)
        self.g.nodes.append(Node("ConstPrefix", name, [cname], [out], {"axis": axis}))

    def _prefix_gather(
        self, name: str, inputs: list[str], ins: list[Value | None], outputs: list[str], attrs: dict[str, Any]
    ) -> bool:
        """Gather(const table, ConstPrefix(ids)) -> ConstPrefix(table[ids])."""
        src = self.alias.get(inputs[1], inputs[1])
        prod = next((n for n in reversed(self.g.nodes) if src in n.outputs), None)
        if prod is None or prod.op != "ConstPrefix" or int(attrs.get("axis", 0)) != 0:
            return False
        table, ids = ins[0], self.g.consts[prod.inputs[0]]
        assert isinstance(table, np.ndarray)
        full = np.take(table, ids, axis=0)
        cname = self.g.add_const(f"{name}.table", full)
        shape = self.g.types[src].shape + tuple(Dim(int(s)) for s in table.shape[1:])
        self.g.types[outputs[0]] = TensorType(str(table.dtype), shape)
        self.g.nodes.append(Node("ConstPrefix", name, [cname], [outputs[0]], {"axis": prod.attrs["axis"]}))
        return True

    def _gemm(
        self,
        name: str,
        inputs: list[str],
        ins: list[Value | None],
        outputs: list[str],
        attrs: dict[str, Any],
        where: str,
    ) -> None:
        """Gemm(x, W, C) -> MatMul(x, W') [+ Add C] with alpha/beta/transB folded into constants."""
        w, c = ins[1], ins[2] if len(ins) > 2 else None
        if attrs.get("transA") or not isinstance(w, np.ndarray):
            raise CompileError(
                f"{where}: only Gemm(x, constant W) without transA is supported", stage="import"
            )
        w2 = (w.T if attrs.get("transB") else w) * np.float32(attrs.get("alpha", 1.0))
        wname = self.g.add_const(f"{name}.weight", np.ascontiguousarray(w2, dtype=w.dtype))
        x = self.alias.get(inputs[0], inputs[0])
        mm = outputs[0] if c is None else f"{outputs[0]}.mm"
        self.g.types[mm] = INFER["Gemm"]([ins[0], w], attrs, where)  # type: ignore[list-item]
        if isinstance(ins[0], TensorType) and ins[0].shape[-1] != Dim(w2.shape[0]):
            raise CompileError(
                f"{where}: shape mismatch, x {list(ins[0].shape)} @ W {list(w2.shape)}", stage="import"
            )
        self.g.nodes.append(Node("MatMul", name, [x, wname], [mm]))
        if c is not None:
            assert isinstance(c, np.ndarray)
            cname = self.g.add_const(f"{name}.bias", (c * np.float32(attrs.get("beta", 1.0))).astype(c.dtype))
            self.g.types[outputs[0]] = self.g.types[mm]
            self.g.nodes.append(Node("Add", f"{name}.bias", [mm, cname], [outputs[0]]))
