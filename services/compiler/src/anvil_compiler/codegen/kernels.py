"""One emitter per op id: a fused op's shapes -> specialized CUDA source, launch dims and the kernel
parameter list recorded in the plan.

**The seam.** ``EMITTERS[op_kind](op) -> KernelSpec`` is the only place that decides which CUDA code
runs an op. A faster kernel (e.g. the GPU team's W4A16 GEMM in ``anvil_kernels/cuda/``) replaces an
entry here: it returns its own source (or an ``extern`` declaration plus its library in
``KernelSpec.extra_sources``), grid/block and the argument list; the plan format, the runtimes and
the memory plan do not change. An emitter must keep the op's semantics (docs/compiler.md) and its
CPU twin; tests/test_codegen.py compiles every emitter's output.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim, TensorType, numel
from anvil_core.plan_format import ACT_CODES

__all__ = ["ACT_CODES", "EMITTERS", "Arg", "KernelSpec", "OpView", "emit", "template_source"]

TEMPLATES = Path(__file__).parent / "templates"
# Staged attention (attention_warp.cu): warps per block, and the most dynamic shared memory it may ask
# for. 99 KB is the per-block opt-in limit of sm_86/sm_89 (sm_80 163 KB, sm_90 227 KB), so one
# kernel runs on every arch the compiler targets; MiniLM at T = 128, D = 32 needs ~35 KB.
ATTENTION_WARPS = 4
# A short batch's staged attention: the rows of one (h, b) spread over up to
# ceil(T / (ATTENTION_WARPS * ATTENTION_ROWS_PER_WARP)) blocks, as many as it takes to launch
# ATTENTION_MIN_BLOCKS working blocks (each stages the sequence's K and V itself). With one block per
# (h, b), a lone sentence (B = 1) ran 12 blocks on 132 SMs, each warp through T / 4 rows one after the
# other: at T = 64 the six attentions took 162 µs of the plan's 392 on the H200
# (bench/results/gpu_op_profile_fp16.json). Splitting at every batch made B = 64, T = 48 8% slower
# (the extra staging; gpu_op_profile_fp16_split.json), hence the bound: ~2 blocks per SM of an H200.
ATTENTION_ROWS_PER_WARP = 4
ATTENTION_MIN_BLOCKS = 256
ATTENTION_SMEM_MAX_BYTES = 99 * 1024
CTYPES = {
    "int64": "long long",
    "int32": "int",
    "bool": "unsigned char",
    "uint8": "unsigned char",
    "float16": "unsigned short",
    "float32": "float",
}
HALF_CTYPES = {"fp16": CTYPES["float16"], "bf16": "anvil_bf16"}  # plan_common.cuh's anvil_ld / anvil_st


@dataclass(frozen=True, slots=True)
class Arg:
    kind: str  # "tensor" | "weight" | "null" | "dim" | "float"
    index: int = -1
    dim: Dim = field(default_factory=lambda: Dim(0))
    value: float = 0.0


@dataclass(slots=True)
class OpView:
    """What an emitter sees of one fused op: roles -> (index, type) of tensors and weights."""

    name: str
    kind: str
    attrs: dict[str, Any]
    inputs: dict[str, tuple[int, TensorType]]
    outputs: list[tuple[int, TensorType]]
    weights: dict[str, tuple[int, np.ndarray]]
    max_seq: int
    # the half variant ("fp16" or "bf16", the plan's GPU precision): activations stored in that type,
    # arithmetic fp32. "": the fp32 plan's kernel. Linears have none: a half plan runs them on cuBLAS
    # or the W4A16 kernels (the executor's gpu_linear.py).
    half: str = ""


@dataclass(slots=True)
class KernelSpec:
    name: str
    source: str
    grid: tuple[tuple[Dim, int], tuple[Dim, int], tuple[Dim, int]]  # ceil(dim / div) per axis
    block: tuple[int, int, int]
    args: list[Arg]
    smem_bytes: int = 0
    extra_sources: list[str] = field(default_factory=list)


def template_source(name: str, **subs: object) -> str:
    return Template((TEMPLATES / f"{name}.cu").read_text()).substitute({k: str(v) for k, v in subs.items()})


def _kernel_name(kind: str, subs: dict[str, object]) -> str:
    """Same specialization -> same name, so identical layers share one compiled kernel."""
    digest = hashlib.sha256(repr(sorted(subs.items())).encode()).hexdigest()[:10]
    return f"anvil_{kind}_{digest}"


def _specialize(kind: str, template: str, subs: dict[str, object]) -> tuple[str, str]:
    name = _kernel_name(kind, subs)
    return name, template_source(template, KERNEL=name, **subs)


def _t(op: OpView, role: str) -> Arg:
    return Arg("tensor", op.inputs[role][0]) if role in op.inputs else Arg("null")


def _w(op: OpView, role: str) -> Arg:
    return Arg("weight", op.weights[role][0]) if role in op.weights else Arg("null")


def _rows(t: TensorType) -> Dim:
    return numel(t.shape[:-1])


def _f(v: float) -> str:
    return f"{float(v):.9e}"


def _act_t(op: OpView) -> str:
    """The activation element type of the kernel: fp16 bits, bf16 bits (anvil_bf16) or float
    (plan_common.cuh's anvil_ld/st)."""
    if op.half and op.half not in HALF_CTYPES:
        raise CompileError(f"op {op.kind} (node {op.name!r}): no {op.half!r} kernels", stage="codegen")
    return HALF_CTYPES[op.half] if op.half else CTYPES["float32"]


def emit_linear(op: OpView) -> KernelSpec:
    if op.half:
        raise CompileError(
            f"op linear (node {op.name!r}): no {op.half} plan kernel ({op.half} plans run linears on "
            "cuBLAS / W4A16)",
            stage="codegen",
        )
    x = op.inputs["x"][1]
    out_i, out_t = op.outputs[0]
    k, n = int(x.shape[-1]), int(out_t.shape[-1])
    quant = "packed" in op.weights
    group = int(op.attrs.get("group", 0)) if quant else 0
    ln = op.attrs.get("ln") is not None
    threads = 256 if ln else 128
    npt = math.ceil(n / threads) if ln else 1
    if ln and npt > 8:
        raise CompileError(
            f"op linear (node {op.name!r}): LayerNorm epilogue over N={n} > 2048", stage="codegen"
        )
    bm = 4 if ln else 8
    subs: dict[str, object] = {
        "K": k,
        "N": n,
        "BM": bm,
        "KC": group if quant else 32,
        "NPT": npt,
        "THREADS": threads,
        "QUANT": int(quant),
        "GROUP": max(group, 1),
        "ACT": ACT_CODES[op.attrs["act"]],
        "LN": int(ln),
        "EPS": _f(op.attrs["ln"][2] if ln else 0.0),
    }
    name, src = _specialize("linear", "linear", subs)
    m = _rows(x)
    grid = ((Dim(1), 1) if ln else (Dim(n), threads * npt), (m, bm), (Dim(1), 1))
    args = [
        _t(op, "x"),
        _w(op, "packed") if quant else _w(op, "weight"),
        _w(op, "scales"),
        _w(op, "zeros"),
        _w(op, "bias"),
        _t(op, "residual"),
        _w(op, "gamma"),
        _w(op, "beta"),
        Arg("tensor", out_i),
        Arg("dim", dim=m),
    ]
    return KernelSpec(name, src, grid, (threads, 1, 1), args)  # type: ignore[arg-type]


def emit_attention(op: OpView) -> KernelSpec:
    a = op.attrs
    q = op.inputs["q"][1]
    mask = op.inputs.get("mask")
    subs: dict[str, object] = {
        "D": a["head_dim"],
        "HEADS": a["heads"],
        "MAX_T": op.max_seq,
        "THREADS": 128,
        "Q_STRIDE": a["strides"][0],
        "K_STRIDE": a["strides"][1],
        "V_STRIDE": a["strides"][2],
        "Q_OFF": a["offsets"][0],
        "K_OFF": a["offsets"][1],
        "V_OFF": a["offsets"][2],
        "SCALE": _f(a["scale"]),
        "HAS_MASK": int(mask is not None),
        "MASK_T": CTYPES[mask[1].dtype] if mask else "int",
        "ACT_T": _act_t(op),
    }
    b, t = q.shape[0], q.shape[1]
    d, warps = int(a["head_dim"]), ATTENTION_WARPS
    smem_floats = op.max_seq * (2 * d + 2) + warps * (d + op.max_seq)  # K (padded), V, the key mask
    smem = smem_floats * 4
    if smem <= ATTENTION_SMEM_MAX_BYTES:  # K and V of a sequence fit in shared memory: blocks per (h, b)
        subs.update(THREADS=32 * warps, SMEM_FLOATS=smem_floats, MIN_BLOCKS=ATTENTION_MIN_BLOCKS)
        name, src = _specialize("attention_warp", "attention_warp", subs)
        grid = ((Dim(int(a["heads"])), 1), (b, 1), (t, warps * ATTENTION_ROWS_PER_WARP))
        block = (32 * warps, 1, 1)
    else:  # long sequences: one block per (query row, h, b), keys streamed from global memory
        name, src = _specialize("attention", "attention", subs)
        grid = ((t, 1), (Dim(int(a["heads"])), 1), (b, 1))
        block, smem = (128, 1, 1), 0
    args = [
        _t(op, "q"),
        _t(op, "k"),
        _t(op, "v"),
        _t(op, "mask"),
        Arg("tensor", op.outputs[0][0]),
        Arg("dim", dim=Dim(1, t=1)),
    ]
    return KernelSpec(name, src, grid, block, args, smem_bytes=smem)  # type: ignore[arg-type]


def emit_layer_norm(op: OpView) -> KernelSpec:
    x = op.inputs["x"][1]
    subs: dict[str, object] = {
        "H": int(x.shape[-1]),
        "THREADS": 128,
        "EPS": _f(op.attrs["eps"]),
        "ACT_T": _act_t(op),
    }
    name, src = _specialize("layer_norm", "layer_norm", subs)
    args = [_t(op, "x"), _t(op, "residual"), _w(op, "gamma"), _w(op, "beta"), Arg("tensor", op.outputs[0][0])]
    return KernelSpec(name, src, ((_rows(x), 1), (Dim(1), 1), (Dim(1), 1)), (128, 1, 1), args)


def emit_embed_ln(op: OpView) -> KernelSpec:
    ids = op.inputs["ids"][1]
    table = op.weights["table"][1]
    pos = op.weights["pos"][1]
    ln = op.attrs.get("ln") is not None
    subs: dict[str, object] = {
        "H": table.shape[1],
        "THREADS": 128,
        "IDS_T": CTYPES[ids.dtype],
        "TABLE_T": CTYPES[str(table.dtype)],
        "POS_ROWS": pos.shape[0],
        "LN": int(ln),
        "EPS": _f(op.attrs["ln"][2] if ln else 0.0),
        "ACT_T": _act_t(op),
    }
    name, src = _specialize("embed_ln", "embed_ln", subs)
    t = ids.shape[1] if len(ids.shape) > 1 else Dim(1)
    args = [
        _t(op, "ids"),
        _w(op, "table"),
        _w(op, "pos"),
        _w(op, "gamma"),
        _w(op, "beta"),
        Arg("tensor", op.outputs[0][0]),
        Arg("dim", dim=t),
    ]
    return KernelSpec(name, src, ((numel(ids.shape), 1), (Dim(1), 1), (Dim(1), 1)), (128, 1, 1), args)


POOL_THREADS = 256  # mean_pool_l2: 8 warps, each every 8th token of the row


def emit_mean_pool_l2(op: OpView) -> KernelSpec:
    x = op.inputs["x"][1]
    mask = op.inputs["mask"][1]
    subs: dict[str, object] = {
        "H": int(x.shape[-1]),
        "THREADS": POOL_THREADS,
        "MASK_T": CTYPES[mask.dtype],
        "NORMALIZE": int(bool(op.attrs.get("normalize", True))),
        "ACT_T": _act_t(op),
    }
    name, src = _specialize("mean_pool_l2", "mean_pool_l2", subs)
    args = [_t(op, "x"), _t(op, "mask"), Arg("tensor", op.outputs[0][0]), Arg("dim", dim=x.shape[1])]
    return KernelSpec(name, src, ((x.shape[0], 1), (Dim(1), 1), (Dim(1), 1)), (POOL_THREADS, 1, 1), args)


def emit_unary(op: OpView) -> KernelSpec:
    x = op.inputs["x"][1]
    name, src = _specialize("unary", "unary", {"ACT": ACT_CODES[op.attrs["act"]], "ACT_T": _act_t(op)})
    n = numel(x.shape)
    args = [_t(op, "x"), Arg("tensor", op.outputs[0][0]), Arg("dim", dim=n)]
    return KernelSpec(name, src, ((n, 256), (Dim(1), 1), (Dim(1), 1)), (256, 1, 1), args)


EMITTERS: dict[str, Callable[[OpView], KernelSpec]] = {
    "linear": emit_linear,
    "attention": emit_attention,
    "layer_norm": emit_layer_norm,
    "embed_ln": emit_embed_ln,
    "mean_pool_l2": emit_mean_pool_l2,
    "unary": emit_unary,
}


def emit(op: OpView) -> KernelSpec:
    fn = EMITTERS.get(op.kind)
    if fn is None:
        raise CompileError(f"no CUDA emitter for op {op.kind} (node {op.name!r})", stage="codegen")
    return fn(op)
