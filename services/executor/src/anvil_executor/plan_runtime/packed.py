"""Packed (varlen) execution of an encoder plan on the CPU: no padding at all.

The sequences of a chunk lie back to back as N token rows; ``cu`` (S + 1,) int64 holds their
cumulative lengths. Every tensor of the plan with a sequence dim, (B, T, ...) in the plan, is viewed
as (N, ...) at its planned arena offset; every per-sequence tensor, (B, ...), as (S, ...). Linears
(and LayerNorms, activations) run on all N rows at once, so a batch of short sentences costs its
tokens, not rows x longest; only the ops that need sequence boundaries read ``cu``:
``embed_ln`` (positions restart per sequence), ``attention`` (fused, per sequence and head, straight
from the fused QKV rows) and ``mean_pool_l2``.

Why it fits the arena: the compiler planned every tensor for max_batch x max_seq; a chunk holds at
most max_batch sequences of at most max_seq tokens, so N <= max_batch x max_seq and every packed
view is no larger than the planned one (offsets and liveness unchanged).

A plan is packable when its ops are of the kinds below, its attention reads q, k and v from one
fused tensor, and its tensors are (B, T, const...) or (B, const...) (``packable`` says why not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anvil_executor.plan_runtime.ops import layer_norm_op, linear, unary
from anvil_executor.plan_runtime.plan import DTYPES
from anvil_kernels.varlen import embed_ln_varlen, mean_pool_l2_varlen
from anvil_kernels.varlen_attention import attention_varlen

if TYPE_CHECKING:
    from anvil_executor.plan_runtime.model import PlanModel

__all__ = ["PackedRunner", "packable"]

ROW_OPS = {"linear": linear, "layer_norm": layer_norm_op, "unary": unary}  # row-wise: packed as is
SEQ_OPS = ("embed_ln", "attention", "mean_pool_l2")  # read the sequence boundaries


def _kind(shape: list[tuple[int, int, int]]) -> str:
    """'seq' for (B, T, const...), 'row' for (B, const...), else ''. Dims are (coef, b, t)."""
    rest_const = all(b == 0 and t == 0 for _, b, t in shape[2:])
    if len(shape) >= 2 and shape[0] == (1, 1, 0) and shape[1] == (1, 0, 1) and rest_const:
        return "seq"
    if shape and shape[0] == (1, 1, 0) and all(b == 0 and t == 0 for _, b, t in shape[1:]):
        return "row"
    return ""


def packable(model: PlanModel) -> str:
    """'' when the plan can run packed, else the reason it cannot."""
    p = model.plan.plan
    if not model.mask_inputs or not model.seq_inputs:
        return "no attention mask / sequence input"
    for i, t in enumerate(p.tensors):
        if not _kind([(int(d.coef), int(d.b), int(d.t)) for d in t.shape]):
            return f"tensor {i} has a shape other than (B, T, ...) or (B, ...)"
    for op in model.ops:
        if op.kind not in ROW_OPS and op.kind not in SEQ_OPS:
            return f"op kind {op.kind!r}"
        if op.kind == "attention" and len({op.inputs[r] for r in "qkv"}) != 1:
            return f"{op.name}: q, k, v in separate tensors"
        if op.kind == "embed_ln" and "gamma" not in op.weights:
            return f"{op.name}: embedding without LayerNorm"
    return ""


class PackedRunner:
    """Runs a packable ``PlanModel``'s ops on packed token rows (see the module docstring)."""

    def __init__(self, model: PlanModel) -> None:
        why = packable(model)
        if why:
            raise ValueError(f"plan cannot run packed: {why}")
        self.m = model
        p = model.plan.plan
        self._seq = [_kind([(int(d.coef), int(d.b), int(d.t)) for d in t.shape]) == "seq" for t in p.tensors]
        self.ids_input = next(n for n in model.seq_inputs if n not in model.mask_inputs)
        self.ids_tensor = next(t for n, t, _, _ in model.inputs if n == self.ids_input)
        self.max_tokens = model.max_batch * model.max_seq  # the arena's planned token rows

    def _view(self, tensor: int, n: int, s: int) -> np.ndarray:
        ti = self.m.plan.plan.tensors[tensor]
        shape = self.m.plan.shape(tensor, 1, n)[1:] if self._seq[tensor] else self.m.plan.shape(tensor, s, 1)
        return self.m.arena.view("activations", int(ti.offset), shape, DTYPES[ti.dtype])

    def run(self, ids: np.ndarray, cu: np.ndarray) -> dict[str, np.ndarray]:
        """ids (N,) token ids of S sequences back to back, cu (S+1,) int64 their cumulative lengths.
        Outputs by name, as views into the arena (valid until the next run): per-token outputs
        (N, ...), per-sequence outputs (S, ...)."""
        n, s = int(ids.size), int(cu.size - 1)
        lens = np.diff(cu)
        if not 1 <= s <= self.m.max_batch or n > self.max_tokens or int(lens.max()) > self.m.max_seq:
            raise ValueError(
                f"{s} sequences, {n} tokens (longest {int(lens.max())}) exceed the plan's "
                f"{self.m.max_batch} x {self.m.max_seq}"
            )
        self._view(self.ids_tensor, n, s)[...] = ids
        ws = self.m.ws
        for op in self.m.ops:
            out = self._view(op.output, n, s)
            if op.kind in ROW_OPS:
                views = {r: self._view(i, n, s) for r, i in op.inputs.items()}
                views["out"] = out
                ROW_OPS[op.kind](op, views, ws)
            elif op.kind == "embed_ln":
                w = op.weights
                ids_v = self._view(op.inputs["ids"], n, s)
                eps = float(op.attrs["eps"])
                embed_ln_varlen(ids_v, cu, w["table"], w["pos"], w["gamma"], w["beta"], eps, out)
            elif op.kind == "attention":
                a = op.attrs
                qkv = self._view(op.inputs["q"], n, s)
                offs = (int(a["offsets0"]), int(a["offsets1"]), int(a["offsets2"]))
                heads, d = int(a["heads"]), int(a["head_dim"])
                attention_varlen(qkv, cu, heads, d, offs, float(a["scale"]), out, ws)
            else:  # mean_pool_l2
                x = self._view(op.inputs["x"], n, s)
                mean_pool_l2_varlen(x, cu, out, bool(op.attrs.get("normalize", 1)))
        return {name: self._view(t, n, s) for name, t, _, _ in self.m.outputs}
