"""The plan's launch table resolved against device addresses: per op, its kernel name, grid, block,
shared memory and argument values at one (B, T).

Every tensor of a plan sits at a static offset in the activation bank and every weight at a static
offset in the weight bank (the compiler's memory plan), so a pointer argument is ``bank base +
offset`` whatever the batch: only grid sizes and DIM arguments follow (B, T). The GPU runtime
resolves the table once per shape bucket and captures it into a CUDA graph.

Plain Python and numpy (the scalar types CuPy's launcher takes): tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from anvil_core.proto_gen import plan_generated as pg
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import eval_dim

__all__ = ["Launch", "resolve_launches"]


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch: ``module.get_function(kernel)(grid, block, args, shared_mem=smem)``."""

    op: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[Any, ...]  # np.uint64 pointers, np.int32 dims, np.float32 scalars


def _name(op: Any) -> str:
    return op.name.decode() if isinstance(op.name, bytes) else str(op.name)


def _grid_dim(g: Any, b: int, t: int) -> int:
    div = int(g.div) or 1
    return max(1, -(-int(g.coef * b**g.b * t**g.t) // div))


def resolve_launches(
    plan: Any,
    act_base: int,
    weight_base: int,
    b: int,
    t: int,
    weight_offsets: Sequence[int] | None = None,
    kernels: Mapping[int, str] | None = None,
    skip: Container[int] = (),
) -> list[Launch]:
    """The launches of ``plan`` (a ``PlanT``) at batch ``b``, sequence ``t``.

    ``act_base``/``weight_base``: device addresses of the activation and weight banks.
    ``weight_offsets``: per plan weight, its offset in a weight bank laid out by the runtime (an fp16
    plan's, precision.py; -1: not on the device) instead of the plan's. ``kernels``: op index -> the
    kernel to launch instead of the plan's (an fp16 plan's ``kernel_f16``). ``skip``: ops the runtime runs
    itself (an fp16 plan's linears), given an empty Launch (kernel ""). Raises
    ValueError on an argument kind or index the plan should not contain (a plan is input from the
    compiler: checked, not trusted).
    """
    tensors, weights = plan.tensors, plan.weights
    out: list[Launch] = []
    for i, op in enumerate(plan.ops):
        if i in skip:
            out.append(Launch(_name(op), "", (1, 1, 1), (1, 1, 1), 0, ()))
            continue
        args: list[Any] = []
        for a in _l(op.args):
            if a.kind == pg.ArgKind.TENSOR:
                if not 0 <= a.index < len(tensors):
                    raise ValueError(f"op {op.name!r}: tensor index {a.index} out of range")
                args.append(np.uint64(act_base + int(tensors[a.index].offset)))
            elif a.kind == pg.ArgKind.WEIGHT:
                if a.index >= len(weights):
                    raise ValueError(f"op {op.name!r}: weight index {a.index} out of range")
                if a.index < 0:
                    args.append(np.uint64(0))
                    continue
                off = int(weights[a.index].offset) if weight_offsets is None else int(weight_offsets[a.index])
                if off < 0:
                    raise ValueError(f"op {op.name!r}: weight {a.index} is not on the device")
                args.append(np.uint64(weight_base + off))
            elif a.kind == pg.ArgKind.DIM:
                args.append(np.int32(eval_dim(a.dim, b, t)))
            elif a.kind == pg.ArgKind.FLOAT:
                args.append(np.float32(a.value))
            else:
                raise ValueError(f"op {op.name!r}: unknown argument kind {a.kind}")
        grid = [_grid_dim(g, b, t) for g in _l(op.grid)]
        block = [int(x) for x in _l(op.block)]
        grid += [1] * (3 - len(grid))
        block += [1] * (3 - len(block))
        kernel = op.kernel.decode() if isinstance(op.kernel, bytes) else str(op.kernel)
        if kernels is not None and i in kernels:
            kernel = kernels[i]
        out.append(
            Launch(
                _name(op),
                kernel,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                int(op.smemBytes or 0),
                tuple(args),
            )
        )
    return out
