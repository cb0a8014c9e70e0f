"""The precision a plan runs in on a GPU, and what an fp16 plan changes on the device.

A plan is an fp32 plan (the CPU backend runs it as such); the compiler records in it, per op, how a
GPU runs it in fp16 (``kernel_f16``: the fp16 variant of the op's kernel, same launch; ``gpu_backend``
on linears, see gpu_linear.py). In an fp16 plan on the device:
  - every fp32 activation tensor is stored fp16 at its planned offset (it takes half the planned
    bytes), except the output of ``mean_pool_l2``, whose kernel writes fp32 (the pooled vector is
    what a sentence encoder serves, in fp32);
  - public fp32 inputs are converted to fp16 in the pinned bank, fp16 outputs back to fp32 on the host:
    clients send and receive what the model spec says (FP32);
  - linear weights are fp16 (or INT4 for the W4A16 kernels); other weights (biases, LayerNorm, the
    embedding tables) keep the plan's dtype. The weight bank is laid out again (``WeightLayout``).
Plain numpy: tested on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anvil_executor.plan_runtime.arena import ALIGN
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import DTYPES, _s, attrs_of

__all__ = [
    "F16_BACKENDS",
    "PRECISIONS",
    "WeightLayout",
    "device_dtypes",
    "f16_kernels",
    "plan_precision",
    "resolve_precision",
]

PRECISIONS = ("auto", "fp16", "fp32")
# the linears' gpu_backend attrs of an fp16 plan (the compiler's codegen/gpu_backend.py; gpu_linear.py)
F16_BACKENDS = ("cublas_f16", "w4a16", "cublas_f16_dequant")


def plan_precision(plan: Any) -> str:
    """What the compiler chose for this plan on a GPU: "fp16" when it recorded fp16 kernels."""
    for op in plan.ops:
        attrs = attrs_of(op)
        if "kernel_f16" in attrs or attrs.get("gpu_backend") in F16_BACKENDS:
            return "fp16"
    return "fp32"


def resolve_precision(wanted: str, plan: Any) -> str:
    """``wanted`` ("auto": the plan's) checked against what the plan can run."""
    if wanted not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {wanted!r}")
    recorded = plan_precision(plan)
    if wanted == "auto":
        return recorded
    if wanted == "fp16" and recorded != "fp16":
        raise ValueError(
            "this plan has no fp16 kernels: deploy it with gpu_precision fp16 (anvil deploy --gpu-precision)"
        )
    return wanted


def f16_kernels(plan: Any) -> dict[int, str]:
    """op index -> its fp16 kernel, for every op but the linears (cuBLAS / W4A16 run those)."""
    out: dict[int, str] = {}
    for i, op in enumerate(plan.ops):
        if _s(op.kind) == "linear":
            continue
        name = attrs_of(op).get("kernel_f16")
        if not name:
            raise ValueError(f"op {_s(op.name)!r} ({_s(op.kind)}) has no fp16 kernel in the plan")
        out[i] = str(name)
    return out


def device_dtypes(plan: Any) -> list[np.dtype]:
    """The dtype of every plan tensor on the device in an fp16 plan; ValueError when an op other than
    the last would read a tensor kept fp32 (a pooled vector fed to another op: not supported yet)."""
    tensors = plan.tensors

    def root(i: int) -> int:
        while int(tensors[i].aliasOf) >= 0:
            i = int(tensors[i].aliasOf)
        return i

    kept = {root(int(o)) for op in plan.ops if _s(op.kind) == "mean_pool_l2" for o in _l(op.outputs)}
    out: list[np.dtype] = []
    for i, ti in enumerate(tensors):
        dt = np.dtype(DTYPES[ti.dtype])
        out.append(np.dtype(np.float16) if dt == np.float32 and root(i) not in kept else dt)
    for op in plan.ops:
        for ix in _l(op.inputs):
            if root(int(ix)) in kept:
                raise ValueError(f"op {_s(op.name)!r} reads a pooled (fp32) tensor: run this plan in fp32")
    return out


@dataclass(slots=True)
class WeightLayout:
    """Blobs placed one after another in the device's weight bank, each ALIGN-aligned."""

    offsets: dict[Any, int] = field(default_factory=dict)
    arrays: dict[Any, np.ndarray] = field(default_factory=dict)
    nbytes: int = 0

    def add(self, key: Any, arr: np.ndarray) -> None:
        if key in self.offsets:
            raise ValueError(f"weight blob {key!r} placed twice")
        self.offsets[key] = self.nbytes
        self.arrays[key] = np.ascontiguousarray(arr)
        self.nbytes += -(-arr.nbytes // ALIGN) * ALIGN

    def offset(self, key: Any) -> int:
        return self.offsets.get(key, -1)
