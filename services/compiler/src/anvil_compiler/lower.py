"""Fused graph + weights -> the plan (flatbuffers `anvil.plan.Plan`), the weight tensors by name,
and the CUDA source of every kernel the plan names."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import flatbuffers
import numpy as np

from anvil_compiler.codegen.gpu_backend import (
    gv_configs_of,
    linear_backend,
    resolve_precision,
    tile_configs_of,
)
from anvil_compiler.codegen.kernels import Arg, KernelSpec, OpView, emit
from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Dim, Graph, Node, TensorType
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.memplan import ALIGN, Interval, plan_memory
from anvil_compiler.passes.quantize import OpWeights
from anvil_core.plan_format import DTYPE_CODES, HALF_KERNEL_ATTRS, HALF_LINEAR_BACKENDS, PLAN_VERSION
from anvil_core.proto_gen import plan_generated as pg

__all__ = ["PLAN_VERSION", "Lowered", "lower"]

ARG_KINDS = {
    "tensor": pg.ArgKind.TENSOR,
    "weight": pg.ArgKind.WEIGHT,
    "null": pg.ArgKind.WEIGHT,
    "dim": pg.ArgKind.DIM,
    "float": pg.ArgKind.FLOAT,
}


@dataclass(slots=True)
class Lowered:
    plan: bytes
    weights: dict[str, np.ndarray]
    sources: dict[str, str]  # kernel name -> CUDA source
    stats: dict[str, Any] = field(default_factory=dict)
    # the quantized plan's error against the unquantized plan (passes/accuracy.py); None when
    # nothing is quantized
    accuracy: dict[str, Any] | None = None


def _roles(n: Node) -> list[str]:
    if n.op == "linear":
        return ["x", "residual"][: len(n.inputs)]
    if n.op == "attention":
        return ["q", "k", "v", "mask"][: len(n.inputs)]
    if n.op == "layer_norm":
        return ["x", "residual"][: len(n.inputs)]
    if n.op == "embed_ln":
        return ["ids"]
    if n.op == "mean_pool_l2":
        return ["x", "mask"]
    return ["x"]


def _dim(d: Dim) -> pg.DimT:
    out = pg.DimT()
    out.coef, out.b, out.t = d.coef, d.b, d.t
    return out


def _attr(key: str, v: Any) -> pg.AttrT:
    a = pg.AttrT()
    a.key = key
    if isinstance(v, bool | int):
        a.ival = int(v)
    elif isinstance(v, float):
        a.fval = v
    else:
        a.sval = str(v)
    return a


def lower(g: Graph, weights: dict[str, OpWeights], opts: CompileOptions) -> Lowered:
    syms = {s for t in g.types.values() for d in t.shape for s in ("b" * d.b + "t" * d.t)}
    max_seq = opts.max_seq if "t" in syms else 1
    index: dict[str, int] = {}
    tensors: list[pg.TensorInfoT] = []
    base: dict[int, int] = {}  # tensor -> tensor that owns its memory
    for name in [*g.inputs, *(o for n in g.nodes for o in n.outputs)]:
        t = g.types[name]
        ti = pg.TensorInfoT()
        ti.name, ti.dtype, ti.shape = (
            g.public.get(name, name),
            DTYPE_CODES[t.dtype],
            [_dim(d) for d in t.shape],
        )
        ti.maxBytes = t.nbytes(opts.max_batch, max_seq)
        index[name] = len(tensors)
        base[len(tensors)] = len(tensors)
        tensors.append(ti)
    for n in g.nodes:
        if n.op == "view":
            i, src = index[n.outputs[0]], base[index[n.inputs[0]]]
            base[i] = src
            tensors[i].aliasOf = src
    kernel_ops = [n for n in g.nodes if n.op != "view"]
    first = {base[index[x]]: -1 for x in g.inputs}
    last: dict[int, int] = {}
    for k, n in enumerate(kernel_ops):
        for out_name in n.outputs:
            first.setdefault(base[index[out_name]], k)
        for in_name in n.inputs:
            last[base[index[in_name]]] = k
    for o in g.outputs:
        last[base[index[o]]] = len(kernel_ops)
    owners = sorted({base[i] for i in base})
    intervals = [
        Interval(i, tensors[i].maxBytes, first.get(i, 0), last.get(i, first.get(i, 0))) for i in owners
    ]
    offsets, bank = plan_memory(intervals)
    for i, ti in enumerate(tensors):
        ti.offset = offsets[base[i]]
    inter = sum(tensors[i].maxBytes for i in owners if i not in {index[x] for x in g.inputs})

    winfos: list[pg.WeightInfoT] = []
    wdata: dict[str, np.ndarray] = {}
    woff = 0
    ops: list[pg.OpT] = []
    sources: dict[str, str] = {}
    precision = resolve_precision(g, opts)
    backends: dict[str, int] = {}
    w4a16_groups: set[int] = set()
    w4a16_kernels: list[str] = []  # the linears' measured per-M kernel rows (gpu_backend.py)
    # id of a weight array -> its weight index; the arrays stay alive in ``weights`` meanwhile.
    # quantize_graph hands every linear that reads one constant the same arrays (ALBERT-style sharing)
    placed: dict[int, int] = {}
    refs = 0
    for k, n in enumerate(kernel_ops):
        roles = _roles(n)
        ins = {r: (index[i], g.types[i]) for r, i in zip(roles, n.inputs, strict=True)}
        wroles: dict[str, tuple[int, np.ndarray]] = {}
        for role, arr in weights.get(n.name, {}).items():
            if id(arr) in placed:  # an array an earlier op reads too (a shared weight): stored once
                wroles[role] = (placed[id(arr)], arr)
                continue
            key = f"op{k}.{role}"
            wi = pg.WeightInfoT()
            wi.name, wi.dtype, wi.shape = key, DTYPE_CODES[str(arr.dtype)], list(arr.shape)
            wi.offset, wi.nbytes = woff, arr.nbytes
            woff += (arr.nbytes + ALIGN - 1) // ALIGN * ALIGN
            placed[id(arr)] = len(winfos)
            wroles[role] = (len(winfos), arr)
            winfos.append(wi)
            wdata[key] = arr
        refs += len(wroles)
        if (
            n.op == "embed_ln"
            and wroles["pos"][1].shape[0] not in (1,)
            and wroles["pos"][1].shape[0] < max_seq
        ):
            raise CompileError(
                f"op embed_ln (node {n.name!r}): {wroles['pos'][1].shape[0]} position rows "
                f"< max_seq {max_seq}",
                stage="plan",
            )
        view = OpView(
            n.name, n.op, n.attrs, ins, [(index[o], g.types[o]) for o in n.outputs], wroles, max_seq
        )
        spec = emit(view)
        sources[spec.name] = spec.source
        op = _op(n, k, spec, ins, roles, view, wroles)
        gpu: dict[str, Any] = {}
        if n.op == "linear":
            gpu = linear_backend(
                {r: a for r, (_, a) in wroles.items()}, int(n.attrs.get("group", 0)), precision, opts.archs
            )
            backends[gpu["gpu_backend"]] = backends.get(gpu["gpu_backend"], 0) + 1
            if (
                precision in HALF_LINEAR_BACKENDS
                and gpu["gpu_backend"] == HALF_LINEAR_BACKENDS[precision]["w4a16"]
            ):
                w4a16_groups.add(int(n.attrs["group"]))
                if "w4a16_kernels" in gpu:
                    w4a16_kernels.append(gpu["w4a16_kernels"])
        elif precision in HALF_KERNEL_ATTRS:  # same launch, activations fp16 / bf16 (plan_common.cuh)
            half = emit(replace(view, half=precision))
            assert (half.grid, half.block, half.args, half.smem_bytes) == (
                spec.grid,
                spec.block,
                spec.args,
                spec.smem_bytes,
            ), f"{precision} variant of {n.name!r} changes its launch"
            sources[half.name] = half.source
            gpu = {HALF_KERNEL_ATTRS[precision]: half.name}
        op.attrs = [*(op.attrs or []), *(_attr(a, v) for a, v in gpu.items())]
        ops.append(op)

    plan = pg.PlanT()
    plan.version, plan.modelName = PLAN_VERSION, g.name
    plan.maxBatch, plan.maxSeq = opts.max_batch, max_seq
    plan.tensors, plan.weights, plan.ops = tensors, winfos, ops
    plan.inputs = [_io(g, x, index[x]) for x in g.inputs]
    plan.outputs = [_io(g, x, index[x]) for x in g.outputs]
    plan.activationBytes, plan.weightBytes, plan.intermediateBytes = bank, woff, inter
    b = flatbuffers.Builder(1024)
    b.Finish(plan.Pack(b), file_identifier=b"ANVP")
    stats = {
        "kernels": len(ops),
        "activation_bytes": bank,
        "intermediate_bytes": inter,
        "weight_bytes": woff,
        "distinct_kernels": len(sources),
        "max_seq": max_seq,
        "int4_linears": sum(1 for n in kernel_ops if n.op == "linear" and n.attrs.get("group")),
        "fp32_linears": sum(1 for n in kernel_ops if n.op == "linear" and not n.attrs.get("group")),
        # on a GPU: the activations' precision and how many linears each backend runs
        # (codegen/gpu_backend.py; per op in the plan's attrs)
        "gpu_precision": precision,
        "gpu_linear_backends": backends,
        "w4a16_groups": sorted(w4a16_groups),  # the W4A16 kernels the artifact's w4a16.fatbin holds
        "w4a16_gv_configs": gv_configs_of(w4a16_kernels),  # and the measured tables' ring GEMVs
        "w4a16_tile_configs": tile_configs_of(w4a16_kernels),  # and tensor-core tiles (sm_90 plans)
        # packed nibbles + scales + zeros: the share of weight_bytes held in INT4 (shared ones once)
        "int4_weight_bytes": sum(
            {
                id(a): a.nbytes
                for w in weights.values()
                for r, a in w.items()
                if r in ("packed", "scales", "zeros")
            }.values()
        ),
        # weight tensors the plan stores, and the ops' reads of a tensor another op stored already
        "weight_tensors": len(winfos),
        "shared_weight_reads": refs - len(winfos),
    }
    return Lowered(bytes(b.Output()), wdata, sources, stats)


def _op(
    n: Node,
    k: int,
    spec: KernelSpec,
    ins: dict[str, tuple[int, TensorType]],
    roles: list[str],
    view: OpView,
    wroles: dict[str, tuple[int, np.ndarray]],
) -> pg.OpT:
    op = pg.OpT()
    op.name, op.kind, op.kernel = n.name, n.op, spec.name
    weight_roles = list(wroles)
    op.inputs, op.inputRoles = [ins[r][0] for r in roles], list[str | None](roles)
    op.outputs = [i for i, _ in view.outputs]
    op.weightRoles = list[str | None](weight_roles)
    op.weights = [wroles[r][0] for r in weight_roles]
    attrs = {
        k2: v
        for k2, v in n.attrs.items()
        if isinstance(v, bool | int | float | str) and k2 not in ("weight", "bias", "table", "pos")
    }
    if n.attrs.get("ln"):
        attrs["eps"] = float(n.attrs["ln"][2])
    for key in ("offsets", "strides"):
        for j, v in enumerate(n.attrs.get(key, [])):
            attrs[f"{key}{j}"] = int(v)
    op.attrs = [_attr(a, v) for a, v in attrs.items()]
    grid = []
    for d, div in spec.grid:
        ld = pg.LaunchDimT()
        ld.coef, ld.b, ld.t, ld.div = d.coef, d.b, d.t, div
        grid.append(ld)
    op.grid, op.block, op.smemBytes = grid, list(spec.block), spec.smem_bytes
    op.args = [_arg(a) for a in spec.args]
    return op


def _arg(a: Arg) -> pg.KernelArgT:
    ka = pg.KernelArgT()
    ka.kind, ka.index, ka.dim, ka.value = ARG_KINDS[a.kind], a.index, _dim(a.dim), a.value
    return ka


def _io(g: Graph, name: str, idx: int) -> pg.IOInfoT:
    io = pg.IOInfoT()
    io.name, io.tensor = g.public.get(name, name), idx
    io.datatype = g.io_datatypes.get(name, "FP32")
    io.dims = [-1 if not d.static else d.coef for d in g.types[name].shape[1:]]
    return io
