"""Reading a compiled plan (`proto/plan.fbs`) and evaluating its symbolic dims."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anvil_core.plan_format import DTYPES, PLAN_VERSION
from anvil_core.proto_gen import plan_generated as pg

__all__ = ["DTYPES", "PLAN_VERSION", "LoadedPlan", "attrs_of", "eval_dim", "load_plan"]


def eval_dim(d: Any, batch: int, seq: int) -> int:
    return int(d.coef * batch**d.b * seq**d.t)


def attrs_of(op: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in op.attrs or []:
        key = a.key.decode() if isinstance(a.key, bytes) else a.key
        sval = a.sval.decode() if isinstance(a.sval, bytes) else a.sval
        out[key] = sval if sval else (a.fval if a.fval else a.ival)
    return out


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(slots=True)
class LoadedPlan:
    plan: Any  # pg.PlanT

    @property
    def name(self) -> str:
        return _s(self.plan.modelName)

    def shape(self, tensor: int, batch: int, seq: int) -> tuple[int, ...]:
        return tuple(eval_dim(d, batch, seq) for d in self.plan.tensors[tensor].shape)

    def dtype(self, tensor: int) -> np.dtype:
        return np.dtype(DTYPES[self.plan.tensors[tensor].dtype])


def load_plan(path: Path) -> LoadedPlan:
    buf = path.read_bytes()
    if not pg.Plan.PlanBufferHasIdentifier(buf, 0):
        raise ValueError(f"{path} is not an Anvil plan (file identifier ANVP missing)")
    plan = pg.PlanT.InitFromPackedBuf(buf, 0)
    if plan.version != PLAN_VERSION:
        raise ValueError(f"{path}: plan version {plan.version}, this runtime reads {PLAN_VERSION}")
    return LoadedPlan(plan)
