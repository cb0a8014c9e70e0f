"""The compiler's graph IR: typed tensors with static shapes over two symbols, B (batch) and
T (sequence), and nodes in topological order.

A dimension is a monomial ``coef * B**b * T**t``: enough to express every shape a BERT/MLP export
computes at run time (``B*T``, ``B*T*H``, ``T``) while keeping shape arithmetic exact. Constants
live in ``Graph.consts`` (numpy arrays); everything else is produced by a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError

__all__ = ["Dim", "Graph", "Node", "Shape", "TensorType", "dim", "numel"]


@dataclass(frozen=True, slots=True)
class Dim:
    """``coef * B**b * T**t``; a plain integer is ``Dim(n, 0, 0)``."""

    coef: int
    b: int = 0
    t: int = 0

    @property
    def static(self) -> bool:
        return self.b == 0 and self.t == 0

    def __mul__(self, other: Dim | int) -> Dim:
        o = dim(other)
        return Dim(self.coef * o.coef, self.b + o.b, self.t + o.t)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim | int) -> Dim:
        o = dim(other)
        if o.coef == 0 or self.coef % o.coef or o.b > self.b or o.t > self.t:
            raise CompileError(f"cannot divide dimension {self} by {o} exactly")
        return Dim(self.coef // o.coef, self.b - o.b, self.t - o.t)

    __truediv__ = __floordiv__

    def eval(self, batch: int, seq: int) -> int:
        return int(self.coef * batch**self.b * seq**self.t)

    def __int__(self) -> int:
        if not self.static:
            raise CompileError(f"dimension {self} is symbolic where a static size is needed")
        return self.coef

    def __index__(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        parts = [str(self.coef)] if self.coef != 1 or self.static else []
        parts += ["B"] * self.b + ["T"] * self.t
        return "*".join(parts)


def dim(x: Dim | int | np.integer) -> Dim:
    return x if isinstance(x, Dim) else Dim(int(x))


Shape = tuple[Dim, ...]


def numel(shape: Shape) -> Dim:
    out = Dim(1)
    for d in shape:
        out = out * d
    return out


@dataclass(slots=True)
class TensorType:
    dtype: str  # numpy dtype name: float32, float16, int64, int32, bool, uint8
    shape: Shape

    def nbytes(self, batch: int, seq: int) -> int:
        return numel(self.shape).eval(batch, seq) * np.dtype(self.dtype).itemsize


@dataclass(slots=True)
class Node:
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Graph:
    """Nodes in topological order; ``types`` covers every non-constant value."""

    name: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    # KServe datatype of each graph input/output as the model's users see it
    io_datatypes: dict[str, str] = field(default_factory=dict)
    # public name of a graph output whose value carries another name internally (ONNX Identity)
    public: dict[str, str] = field(default_factory=dict)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name)

    def add_const(self, hint: str, value: np.ndarray) -> str:
        name = hint
        k = 0
        while name in self.consts or name in self.types:
            k += 1
            name = f"{hint}.{k}"
        self.consts[name] = value
        return name

    def prune(self) -> None:
        """Drop nodes whose outputs nobody reads, and constants nobody references."""
        live = set(self.outputs)
        kept: list[Node] = []
        for n in reversed(self.nodes):
            if any(o in live for o in n.outputs):
                kept.append(n)
                live.update(n.inputs)
                live.update(_attr_names(n.attrs.values()))
        self.nodes = kept[::-1]
        self.consts = {k: v for k, v in self.consts.items() if k in live}
        self.types = {k: v for k, v in self.types.items() if k in live or k in self.inputs}


def _attr_names(values: Any) -> list[str]:
    """Constant names a node refers to through its attributes (weights of fused ops)."""
    out: list[str] = []
    for v in values:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, tuple | list):
            out.extend(_attr_names(v))
    return out
