"""The precision a plan runs in on a GPU, and what a half (fp16 or bf16) plan changes on the device.

A plan is an fp32 plan (the CPU backend runs it as such); the compiler records in it, per op, how a
GPU runs it in fp16 or bf16 (``kernel_f16`` / ``kernel_bf16``: that variant of the op's kernel, same
launch; ``gpu_backend`` on linears, see gpu_linear.py; anvil_core.plan_format's HALF_KERNEL_ATTRS and
HALF_LINEAR_BACKENDS). In a half plan on the device:
  - every fp32 activation tensor is stored in the half type at its planned offset (it takes half the
    planned bytes), except the output of ``mean_pool_l2``, whose kernel writes fp32 (the pooled
    vector is what a sentence encoder serves, in fp32);
  - public fp32 inputs are converted in the pinned bank, half outputs back to fp32 on the host:
    clients send and receive what the model spec says (FP32);
  - linear weights are in the half type (or INT4 for the W4A16 kernels); other weights (biases,
    LayerNorm, the embedding tables) keep the plan's dtype. The weight bank is laid out again
    (``WeightLayout``).
On the host, bf16 values are their bit patterns in uint16 arrays (``BF16``: numpy has no bfloat16; no
plan tensor is uint16, so the dtype is unambiguous here); ``to_half`` / ``to_f32`` convert.
Plain numpy: tested on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anvil_core.plan_format import HALF_KERNEL_ATTRS, HALF_LINEAR_BACKENDS
from anvil_executor.plan_runtime.arena import ALIGN
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import DTYPES, _s, attrs_of
from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

__all__ = [
    "BF16",
    "HALF",
    "LINEAR_KINDS",
    "PRECISIONS",
    "WeightLayout",
    "device_dtypes",
    "half_dtype",
    "half_kernels",
    "plan_precision",
    "resolve_precision",
    "to_f32",
    "to_half",
]

PRECISIONS = ("auto", "fp16", "bf16", "fp32")
HALF = tuple(HALF_KERNEL_ATTRS)  # ("fp16", "bf16")
BF16 = np.dtype(np.uint16)  # a bf16 plan's activations on the host: their bit patterns
# a linear's gpu_backend attr -> (the plan's precision, what runs it: "cublas", "w4a16" or "dequant")
LINEAR_KINDS: dict[str, tuple[str, str]] = {
    name: (prec, kind) for prec, names in HALF_LINEAR_BACKENDS.items() for kind, name in names.items()
}


def half_dtype(precision: str) -> np.dtype:
    """The host dtype of a half precision's values: float16, or BF16 (uint16 bit patterns)."""
    if precision not in HALF:
        raise ValueError(f"not a half precision: {precision!r} (one of {HALF})")
    return np.dtype(np.float16) if precision == "fp16" else BF16


def to_half(a: np.ndarray, precision: str) -> np.ndarray:
    """Values (any float dtype) -> the half precision's host storage, round to nearest even."""
    if precision == "bf16":
        return f32_to_bf16_bits(np.asarray(a, dtype=np.float32))
    return np.ascontiguousarray(a, dtype=half_dtype(precision))


def to_f32(a: np.ndarray) -> np.ndarray:
    """A device tensor's host copy as the spec's fp32: fp16 and bf16 (BF16) converted, others as they are."""
    if a.dtype == BF16:
        return bf16_bits_to_f32(a)
    return a.astype(np.float32) if a.dtype == np.float16 else a


def plan_precision(plan: Any) -> str:
    """What the compiler chose for this plan on a GPU: "fp16" or "bf16" when it recorded that
    precision's kernels, else "fp32"."""
    for op in plan.ops:
        attrs = attrs_of(op)
        for precision, attr in HALF_KERNEL_ATTRS.items():
            if attr in attrs:
                return precision
        kind = LINEAR_KINDS.get(str(attrs.get("gpu_backend", "")))
        if kind is not None:
            return kind[0]
    return "fp32"


def resolve_precision(wanted: str, plan: Any) -> str:
    """``wanted`` ("auto": the plan's) checked against what the plan can run."""
    if wanted not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {wanted!r}")
    recorded = plan_precision(plan)
    if wanted == "auto":
        return recorded
    if wanted in HALF and recorded != wanted:
        raise ValueError(
            f"this plan has no {wanted} kernels ({recorded} plan): deploy it with gpu_precision "
            f"{wanted} (anvil deploy --gpu-precision)"
        )
    return wanted


def half_kernels(plan: Any, precision: str) -> dict[int, str]:
    """op index -> its kernel of ``precision`` ("fp16" / "bf16"), for every op but the linears
    (cuBLAS / W4A16 run those)."""
    attr = HALF_KERNEL_ATTRS[precision]
    out: dict[int, str] = {}
    for i, op in enumerate(plan.ops):
        if _s(op.kind) == "linear":
            continue
        name = attrs_of(op).get(attr)
        if not name:
            raise ValueError(f"op {_s(op.name)!r} ({_s(op.kind)}) has no {precision} kernel in the plan")
        out[i] = str(name)
    return out


def device_dtypes(plan: Any, precision: str = "fp16") -> list[np.dtype]:
    """The dtype of every plan tensor on the device in a half plan; ValueError when an op other than
    the last would read a tensor kept fp32 (a pooled vector fed to another op: not supported yet)."""
    tensors = plan.tensors

    def root(i: int) -> int:
        while int(tensors[i].aliasOf) >= 0:
            i = int(tensors[i].aliasOf)
        return i

    kept = {root(int(o)) for op in plan.ops if _s(op.kind) == "mean_pool_l2" for o in _l(op.outputs)}
    half = half_dtype(precision)
    out: list[np.dtype] = []
    for i, ti in enumerate(tensors):
        dt = np.dtype(DTYPES[ti.dtype])
        out.append(half if dt == np.float32 and root(i) not in kept else dt)
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
