"""Weight storage per fused op: INT4 for linears (`anvil_kernels.quantize`, round-to-nearest, or GPTQ
with ``opts.gptq``, `passes/calibrate.py`), fp16 embedding tables, fp32 for everything else and
for opted-out layers. Returns role -> array per op.

A weight several linears read (one initializer under several MatMuls: ALBERT-style sharing) is
converted and quantized once: those linears get the same array objects, which `lower` stores once
in the plan. GPTQ quantizes per linear (its error feedback depends on that linear's inputs), so
under ``opts.gptq`` each use gets its own INT4 weight."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from anvil_compiler.ir import Graph, Node
from anvil_compiler.options import CompileOptions
from anvil_kernels import Int4Weight, quantize

__all__ = ["OpWeights", "fp32_linear", "quantize_graph"]

OpWeights = dict[str, np.ndarray]


@dataclass(slots=True)
class _Shared:
    """What earlier linears made of their weights, by constant name: its fp32 array, and its INT4
    weight per group size (a linear reading the same constant reuses them: same objects)."""

    f32: dict[str, np.ndarray] = field(default_factory=dict)
    int4: dict[tuple[str, int], Int4Weight] = field(default_factory=dict)


def _group(k: int, want: int) -> int:
    for g in (256, 128, 64, 32):
        if g <= want and k % g == 0:
            return g
    return 0


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _ln(g: Graph, out: OpWeights, ln: tuple[str, str, float] | None) -> None:
    if ln is not None:
        out["gamma"], out["beta"] = _f32(g.consts[ln[0]]).reshape(-1), _f32(g.consts[ln[1]]).reshape(-1)


def quantize_graph(g: Graph, opts: CompileOptions) -> dict[str, OpWeights]:
    """Weights of every kernel op by node name; sets ``attrs['group']`` on INT4 linears."""
    groups = {
        n.name: _group(g.consts[n.attrs["weight"]].shape[0], opts.group_size)
        for n in g.nodes
        if n.op == "linear" and not opts.keeps_fp32(n.name)
    }
    groups = {k: v for k, v in groups.items() if v}
    gptq: dict[str, Int4Weight] = {}
    if opts.gptq and groups:
        from anvil_compiler.passes.calibrate import gptq_graph

        gptq = gptq_graph(g, opts, groups)
    weights: dict[str, OpWeights] = {}
    shared = _Shared()
    for n in g.nodes:
        w: OpWeights = {}
        if n.op == "linear":
            _linear(g, n, opts, groups.get(n.name, 0), gptq.get(n.name), w, shared)
        elif n.op == "embed_ln":
            dt = np.float16 if opts.quantize and opts.embeddings_fp16 else np.float32
            w["table"] = np.ascontiguousarray(g.consts[n.attrs["table"]], dtype=dt)
            w["pos"] = _f32(g.consts[n.attrs["pos"]])
            _ln(g, w, n.attrs["ln"])
        elif n.op == "layer_norm":
            _ln(g, w, (n.attrs["gamma"], n.attrs["beta"], n.attrs["eps"]))
        weights[n.name] = w
    return weights


def _linear(
    g: Graph,
    n: Node,
    opts: CompileOptions,
    group: int,
    q: Int4Weight | None,
    w: OpWeights,
    shared: _Shared | None = None,
) -> None:
    """``shared``: what earlier linears made of their weights, reused by a linear reading the same
    constant (same objects, so the plan stores them once)."""
    shared = _Shared() if shared is None else shared
    name = n.attrs["weight"]
    if name not in shared.f32:
        shared.f32[name] = _f32(g.consts[name])  # (K, N)
    wt = shared.f32[name]
    n.attrs["group"] = group
    if group:
        if q is None:
            if (name, group) not in shared.int4:
                shared.int4[name, group] = quantize(
                    wt, group_size=group, scale_dtype="fp16", clip_search=opts.clip_search
                )
            q = shared.int4[name, group]
        w["packed"], w["scales"], w["zeros"] = q.packed, q.scales, q.zeros
    else:
        w["weight"] = wt
    if n.attrs.get("bias"):
        w["bias"] = _f32(g.consts[n.attrs["bias"]]).reshape(-1)
    _ln(g, w, n.attrs.get("ln"))


def fp32_linear(g: Graph, n: Node, opts: CompileOptions) -> OpWeights:
    """The weights of linear ``n`` kept fp32 (the error budget's fallback); clears its group."""
    w: OpWeights = {}
    _linear(g, n, opts, 0, None, w)
    return w
