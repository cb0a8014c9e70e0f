"""Small helpers the fusion patterns share: who produces / reads a value, constants, replacement."""

from __future__ import annotations

import numpy as np

from anvil_compiler.ir import Graph, Node

__all__ = ["Matcher"]


class Matcher:
    """A snapshot of producer/consumer maps; rebuild (``Matcher(g)``) after editing the graph."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.prod = g.producers()
        self.cons = g.consumers()

    def producer(self, name: str, op: str | tuple[str, ...] | None = None) -> Node | None:
        n = self.prod.get(name)
        if n is None:
            return None
        ops = (op,) if isinstance(op, str) else op
        return n if ops is None or n.op in ops else None

    def single_use(self, name: str) -> bool:
        return len(self.cons.get(name, [])) == 1 and name not in self.g.outputs

    def only_consumer(self, name: str, op: str | tuple[str, ...]) -> Node | None:
        users = self.cons.get(name, [])
        ops = (op,) if isinstance(op, str) else op
        if len(users) == 1 and users[0].op in ops and name not in self.g.outputs:
            return users[0]
        return None

    def const(self, name: str) -> np.ndarray | None:
        return self.g.consts.get(name)

    def scalar(self, name: str) -> float | None:
        c = self.g.consts.get(name)
        if c is None or c.size != 1:
            return None
        return float(c.reshape(-1)[0])

    def split_const(self, node: Node) -> tuple[str, np.ndarray] | None:
        """For a binary node with one constant operand: (the other input, the constant)."""
        a, b = node.inputs
        if b in self.g.consts and a not in self.g.consts:
            return a, self.g.consts[b]
        if a in self.g.consts and b not in self.g.consts:
            return b, self.g.consts[a]
        return None

    def replace(self, old: Node, new: Node) -> None:
        """Put ``new`` where ``old`` was (it must produce old's outputs); dead nodes go at prune."""
        idx = self.g.nodes.index(old)
        self.g.nodes[idx] = new
