"""Constant folding: numpy evaluation of ONNX ops whose inputs are all known.

Shape arithmetic runs here too: ``Shape`` of a tensor with symbolic dims yields an object array of
`ir.Dim`, and Gather/Concat/Unsqueeze/Slice/Mul over it keep the symbols, so the Shape -> Gather ->
Unsqueeze -> Concat -> Reshape chains of ``torch.onnx.export`` fold into static reshape targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim

__all__ = ["FOLDABLE", "evaluate", "normalize"]


def normalize(a: np.ndarray) -> np.ndarray:
    """Object arrays of dims become int64 when every dim is static."""
    if a.dtype != object:
        return a
    flat = [x.coef if isinstance(x, Dim) and x.static else x for x in a.reshape(-1)]
    if all(isinstance(x, int | np.integer) for x in flat):
        return np.array(flat, dtype=np.int64).reshape(a.shape)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(a.shape)


def _axes(attrs: dict[str, Any], ins: list[np.ndarray], idx: int) -> list[int] | None:
    if len(ins) > idx and ins[idx] is not None and ins[idx].size:
        return [int(a) for a in ins[idx].reshape(-1)]
    return list(attrs["axes"]) if "axes" in attrs else None


def _slice(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    data = ins[0]
    starts, ends = ins[1].reshape(-1), ins[2].reshape(-1)
    axes = ins[3].reshape(-1) if len(ins) > 3 and ins[3] is not None else np.arange(len(starts))
    steps = ins[4].reshape(-1) if len(ins) > 4 and ins[4] is not None else np.ones(len(starts), np.int64)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[int(a)] = slice(int(s), int(max(min(int(e), 2**62), -(2**62))), int(st))
    return data[tuple(index)]


def _reduce_mean(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    axes = _axes(attrs, ins, 1)
    keep = bool(attrs.get("keepdims", 1))
    return np.mean(ins[0], axis=None if axes is None else tuple(axes), keepdims=keep).astype(ins[0].dtype)


def _cast(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    from onnx.helper import tensor_dtype_to_np_dtype

    dt = tensor_dtype_to_np_dtype(int(attrs["to"]))
    if ins[0].dtype == object:
        return ins[0] if np.issubdtype(dt, np.integer) else ins[0].astype(dt)
    return ins[0].astype(dt)


def _unsqueeze(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    axes = _axes(attrs, ins, 1) or []
    out = ins[0]
    rank = out.ndim + len(axes)
    for a in sorted(x % rank for x in axes):
        out = np.expand_dims(out, a)
    return out


def _squeeze(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    axes = _axes(attrs, ins, 1)
    return np.squeeze(ins[0], axis=None if axes is None else tuple(axes))


def _reshape(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    shape = [int(s) for s in ins[1].reshape(-1)]
    shape = [ins[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return ins[0].reshape(shape)


def _constant_of_shape(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    from onnx import numpy_helper

    value = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    shape = [int(s) for s in ins[0].reshape(-1)]  # a symbolic dim raises: it cannot fold
    return np.full(shape, value.reshape(-1)[0], dtype=value.dtype)


def _softmax(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    axis = int(attrs.get("axis", -1))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _layer_norm(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + float(attrs.get("epsilon", 1e-5))) * ins[1]
    return (y + ins[2] if len(ins) > 2 else y).astype(x.dtype)


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    def run(ins: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        a, b = ins
        out = np.asarray(fn(a, b))
        if a.dtype != object and b.dtype != object and out.dtype != np.bool_:
            out = out.astype(np.result_type(a.dtype, b.dtype))
        return out

    return run


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object or np.issubdtype(a.dtype, np.integer):
        return a // b
    return a / b


_ERF = np.vectorize(math.erf, otypes=[np.float64])

FOLDABLE: dict[str, Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]] = {
    "Identity": lambda i, a: i[0],
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_div),
    "Pow": _binary(np.power),
    "Equal": _binary(np.equal),
    "Where": lambda i, a: np.where(i[0], i[1], i[2]),
    "Sqrt": lambda i, a: np.sqrt(i[0]),
    "Neg": lambda i, a: -i[0],
    "Erf": lambda i, a: _ERF(i[0]).astype(i[0].dtype),
    "Relu": lambda i, a: np.maximum(i[0], 0).astype(i[0].dtype),
    "Sigmoid": lambda i, a: (1 / (1 + np.exp(-i[0]))).astype(i[0].dtype),
    "Tanh": lambda i, a: np.tanh(i[0]),
    "MatMul": lambda i, a: np.matmul(i[0], i[1]),
    "Transpose": lambda i, a: np.transpose(i[0], a.get("perm")),
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda i, a: np.concatenate(i, axis=int(a["axis"])),
    "Gather": lambda i, a: np.take(i[0], i[1], axis=int(a.get("axis", 0))),
    "Slice": _slice,
    "Cast": _cast,
    "ReduceMean": _reduce_mean,
    "ConstantOfShape": _constant_of_shape,
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
}


def evaluate(op: str, node: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """The value of ``op`` over known inputs; a CompileError names the node when it cannot fold."""
    fn = FOLDABLE.get(op)
    if fn is None:
        raise CompileError(f"op {op} (node {node!r}) cannot be constant-folded", stage="fold")
    try:
        return normalize(np.asarray(fn(inputs, attrs)))
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"op {op} (node {node!r}): constant folding failed: {exc}", stage="fold") from exc
