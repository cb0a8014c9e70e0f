"""Shape and dtype inference for the ONNX ops the compiler runs (not folds).

Each rule takes the input types (a `TensorType` for a run-time value, an ndarray for a constant)
and returns the output type; a mismatch raises a CompileError naming the op and node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim, Shape, TensorType, dim, numel

__all__ = ["INFER", "broadcast"]

Value = TensorType | np.ndarray


def _t(v: Value) -> TensorType:
    if isinstance(v, TensorType):
        return v
    return TensorType(str(v.dtype), tuple(dim(int(d)) for d in v.shape))


def broadcast(a: Shape, b: Shape, where: str) -> Shape:
    n = max(len(a), len(b))
    a = (Dim(1),) * (n - len(a)) + a
    b = (Dim(1),) * (n - len(b)) + b
    out: list[Dim] = []
    for x, y in zip(a, b, strict=True):
        if x == y or y == Dim(1):
            out.append(x)
        elif x == Dim(1):
            out.append(y)
        else:
            raise CompileError(f"{where}: shapes {list(a)} and {list(b)} do not broadcast", stage="import")
    return tuple(out)


def _same(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    t = _t(ins[0])
    return TensorType(t.dtype, t.shape)


def _binary(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    a, b = _t(ins[0]), _t(ins[1])
    dtype = a.dtype if isinstance(ins[0], TensorType) else b.dtype
    return TensorType(dtype, broadcast(a.shape, b.shape, where))


def _compare(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    return TensorType("bool", _binary(ins, attrs, where).shape)


def _where(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    c, a, b = (_t(v) for v in ins)
    return TensorType(a.dtype, broadcast(c.shape, broadcast(a.shape, b.shape, where), where))


def _matmul(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    a, b = _t(ins[0]), _t(ins[1])
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise CompileError(f"{where}: MatMul needs rank >= 2 operands, got {list(a.shape)}", stage="import")
    if a.shape[-1] != b.shape[-2]:
        raise CompileError(
            f"{where}: shape mismatch, {list(a.shape)} @ {list(b.shape)} (K {a.shape[-1]} != {b.shape[-2]})",
            stage="import",
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2], where)
    return TensorType(a.dtype, (*batch, a.shape[-2], b.shape[-1]))


def _reshape(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    x, target = _t(ins[0]), ins[1]
    if not isinstance(target, np.ndarray):
        raise CompileError(f"{where}: Reshape target shape is not a constant", stage="import")
    dims: list[Dim | None] = []
    for i, s in enumerate(target.reshape(-1)):
        if isinstance(s, Dim):
            dims.append(s)
        elif int(s) == 0:
            dims.append(x.shape[i])
        elif int(s) == -1:
            dims.append(None)
        else:
            dims.append(Dim(int(s)))
    known = Dim(1)
    for d in dims:
        known = known * d if d is not None else known
    total = numel(x.shape)
    if dims.count(None) == 1:
        dims[dims.index(None)] = total // known
    out = tuple(d for d in dims if d is not None)
    if numel(out) != total:
        raise CompileError(f"{where}: cannot reshape {list(x.shape)} to {list(out)}", stage="import")
    return TensorType(x.dtype, out)


def _transpose(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    x = _t(ins[0])
    perm = attrs.get("perm") or list(range(len(x.shape)))[::-1]
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


def _axes(ins: list[Value], attrs: dict[str, Any]) -> list[int]:
    if len(ins) > 1 and isinstance(ins[1], np.ndarray):
        return [int(a) for a in ins[1].reshape(-1)]
    return [int(a) for a in attrs.get("axes", [])]


def _unsqueeze(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    x = _t(ins[0])
    shape = list(x.shape)
    rank = len(shape) + len(_axes(ins, attrs))
    for a in sorted(a % rank for a in _axes(ins, attrs)):
        shape.insert(a, Dim(1))
    return TensorType(x.dtype, tuple(shape))


def _squeeze(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    x = _t(ins[0])
    axes = {a % len(x.shape) for a in _axes(ins, attrs)} or {i for i, d in enumerate(x.shape) if d == Dim(1)}
    return TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _reduce_mean(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    x = _t(ins[0])
    axes = {a % len(x.shape) for a in _axes(ins, attrs)} or set(range(len(x.shape)))
    keep = bool(attrs.get("keepdims", 1))
    shape = [Dim(1) if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes]
    return TensorType(x.dtype, tuple(shape))


def _gather(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    data, idx = _t(ins[0]), _t(ins[1])
    axis = int(attrs.get("axis", 0)) % len(data.shape)
    return TensorType(data.dtype, (*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :]))


def _concat(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    ts = [_t(v) for v in ins]
    axis = int(attrs["axis"]) % len(ts[0].shape)
    total = Dim(0)
    for t in ts:
        if not t.shape[axis].static:
            raise CompileError(f"{where}: Concat along a symbolic axis", stage="import")
        total = Dim(total.coef + t.shape[axis].coef)
    return TensorType(ts[0].dtype, (*ts[0].shape[:axis], total, *ts[0].shape[axis + 1 :]))


def _cast(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    from onnx.helper import tensor_dtype_to_np_dtype

    return TensorType(str(np.dtype(tensor_dtype_to_np_dtype(int(attrs["to"])))), _t(ins[0]).shape)


def _gemm(ins: list[Value], attrs: dict[str, Any], where: str) -> TensorType:
    a, b = _t(ins[0]), _t(ins[1])
    m = a.shape[1] if attrs.get("transA") else a.shape[0]
    n = b.shape[0] if attrs.get("transB") else b.shape[1]
    return TensorType(a.dtype, (m, n))


Rule = Callable[[list[Value], dict[str, Any], str], TensorType]
INFER: dict[str, Rule] = {
    **{op: _same for op in ("Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Neg", "Identity", "Softmax")},
    **{op: _binary for op in ("Add", "Sub", "Mul", "Div", "Pow")},
    "LayerNormalization": _same,
    "Equal": _compare,
    "Where": _where,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "ReduceMean": _reduce_mean,
    "Gather": _gather,
    "Concat": _concat,
    "Cast": _cast,
}
