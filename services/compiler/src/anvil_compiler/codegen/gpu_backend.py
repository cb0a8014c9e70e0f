"""The GPU side of a plan decided at compile time: the precision its activations run in on a GPU, and
which backend runs each linear there. Both are recorded in the plan (op attrs ``kernel_f16``,
``gpu_backend``, ``w4a16_max_m``) and in the manifest's stats; the executor's GPU runtime follows them
(plan_runtime/gpu_linear.py). The CPU runtime ignores them: it always runs the fp32 plan.

- precision fp32: fp32 weights -> ``cublas_tf32`` (cuBLAS, TF32 unless ANVIL_GPU_TF32=false, then the
  plan's epilogue); INT4 weights -> ``plan_int4`` (the compiler's generic ``linear.cu``).
- precision fp16: fp32 weights -> ``cublas_f16`` (weights converted to fp16 at load, cuBLAS fp16 in and
  out, fp32 accumulation); INT4 weights -> ``w4a16`` (the W4A16 kernel family of anvil_kernels.cuda
  for M <= ``w4a16_max_m`` rows, cuBLAS fp16 on the weights dequantized at load above), or
  ``cublas_f16_dequant`` (cuBLAS fp16 on the dequantized weights for every M) where the W4A16
  kernels cannot take the layer (group 32, N % 16 != 0).
- precision bf16: the same in bf16: ``cublas_bf16``, ``w4a16_bf16``, ``cublas_bf16_dequant``.

``W4A16_MAX_M``: the H200 measurement (bench/results/kernels_gpu.md, w4a16_dispatch.json) has the
GEMV-like W4A16 kernel 1.5-1.8x faster than cuBLAS bf16 up to M = 16 on the three large shapes
(8192x8192, 4096x14336, 14336x4096): the rule's 16 rows, for a shape no table measured. Per linear
shape the measured table kept with the kernels (``anvil_kernels.cuda.packaged_table`` for each of the
plan's archs that has one) decides instead:

- where cuBLAS on dense weights measured faster at the smallest M (MiniLM's 384x1152 and 384x1536:
  2.9 vs 4.0 us at M = 16), the linear runs ``cublas_f16_dequant`` for every M;
- a plan whose archs are all sm_90 (``tiles_allowed``) follows the table as far as an INT4 kernel
  measured faster than cuBLAS, tensor-core tiles included (8192x8192 on the H200 at 9877a4f: wgs32 at
  M = 32, wgs64nd at 64, cuBLAS from 128 on, so ``w4a16_max_m`` 64);
- any other plan keeps the GEMV-like kernels, at most ``W4A16_MAX_M`` rows, and fewer where the
  table has cuBLAS faster sooner.

``w4a16_from`` in the op's attrs names the table or "rule".

Which W4A16 kernel runs each M up to ``w4a16_max_m`` is the measured table's too: ``w4a16_kernels``
records, per arch whose table measured the shape, the table's rows up to that M
(``"sm_90:1=gvb8w,4=gvb8w,16=gemv,32=wgs32/4,64=wgs64nd/4"``, a tile with its measured split:
``anvil_kernels.cuda.w4a16_dispatch.format_rows``). The kernels those rows name beyond the rule's
(the ring GEMVs, ``GV_CONFIGS``, and the tiles) are compiled into the artifact's ``w4a16.fatbin``
(``w4a16_gv_configs`` and ``w4a16_tile_configs`` in the stats; sm_90a code where it holds tiles), and
the executor hands the rows of its device's arch to the kernels' dispatcher
(``W4A16Linear(table=...)``); a shape or arch no table measured runs the rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anvil_compiler.ir import Graph
from anvil_compiler.options import CompileOptions
from anvil_core.plan_format import HALF_LINEAR_BACKENDS
from anvil_kernels.cuda import GV_CONFIGS, packaged_table
from anvil_kernels.cuda.w4a16_dispatch import GEMV_LIKE, RULE_GEMV_ROWS, Row, format_rows, parse_rows

__all__ = [
    "W4A16_GROUPS",
    "W4A16_MAX_M",
    "gv_configs_of",
    "linear_backend",
    "resolve_precision",
    "tile_configs_of",
    "tiles_allowed",
]

W4A16_MAX_M = RULE_GEMV_ROWS  # the rule's GEMV-like rows (16): where tiles are not allowed or measured
TILE_ARCH = "sm_90"  # where a plan may carry the tensor-core tiles (tiles_allowed)
W4A16_GROUPS = (64, 128, 256)  # anvil_kernels.cuda.w4a16.SUPPORTED_GROUPS (kept import-free of cupy)


def resolve_precision(g: Graph, opts: CompileOptions) -> str:
    """``opts.gpu_precision`` with "auto" resolved: fp16 for an encoder (the graph has attention);
    "bf16" only when asked for."""
    if opts.gpu_precision != "auto":
        return opts.gpu_precision
    return "fp16" if any(n.op == "attention" for n in g.nodes) else "fp32"


def linear_backend(
    weights: dict[str, np.ndarray], group: int, precision: str, archs: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The op attrs of one linear: ``gpu_backend`` (per precision: anvil_core.plan_format's
    HALF_LINEAR_BACKENDS) and, for the W4A16 backend, ``w4a16_max_m`` (the fewest rows any of
    ``archs``' measured tables allows, else W4A16_MAX_M) and ``w4a16_from``. The measured tables are
    bf16 runs of the same kernels (fp16 reads the same bytes), so both half precisions follow them."""
    names = HALF_LINEAR_BACKENDS.get(precision)
    if "packed" not in weights:
        return {"gpu_backend": names["cublas"] if names else "cublas_tf32"}
    if names is None:
        return {"gpu_backend": "plan_int4"}
    k = 2 * int(weights["packed"].shape[0])
    n = int(weights["packed"].shape[1])
    if not (group in W4A16_GROUPS and n % 16 == 0 and k % group == 0):
        return {"gpu_backend": names["dequant"]}
    tiles = tiles_allowed(archs)
    measured = {  # arch -> rows, for each of the plan's archs whose table measured this shape
        arch: table.int4_measured_rows(n, k) if tiles else table.int4_max_rows(W4A16_MAX_M, n, k)
        for arch in sorted(archs)
        if (table := packaged_table(arch)) is not None and (k, n) in table.entries
    }
    rows, source = W4A16_MAX_M, "rule"
    if measured:
        arch = min(measured, key=lambda a: measured[a])
        rows, source = measured[arch], f"table {arch}"
    if rows == 0:
        return {"gpu_backend": names["dequant"], "w4a16_from": source}
    attrs: dict[str, Any] = {"gpu_backend": names["w4a16"], "w4a16_max_m": rows, "w4a16_from": source}
    kernels = {arch: _table_rows(arch, k, n, rows, tiles) for arch in sorted(measured)}
    if any(kernels.values()):
        attrs["w4a16_kernels"] = format_rows({a: r for a, r in kernels.items() if r})
    return attrs


def tiles_allowed(archs: tuple[str, ...]) -> bool:
    """Whether a plan for ``archs`` may run the tensor-core tiles (``TILE_ARCH`` alone: the wg/wgs
    tiles' wgmma needs sm_90a code, which runs on sm_90 devices only, and only sm_90 was measured)."""
    return bool(archs) and all(a == TILE_ARCH for a in archs)


def _table_rows(arch: str, k: int, n: int, rows: int, tiles: bool) -> list[Row]:
    """The measured (M, kernel, split) rows of ``arch``'s table for (K, N) that decide M = 1..rows:
    each covers the Ms above the previous row's up to its own, so the rows up to the first at or past
    ``rows``. Without ``tiles``, empty where one would name a kernel that is not GEMV-like (the
    build then holds no tensor-core tiles; the rule decides there)."""
    table = packaged_table(arch)
    assert table is not None
    out: list[Row] = []
    for m, choice in table.entries.get((k, n), ()):
        if choice.kernel not in GEMV_LIKE and not tiles:
            return []
        out.append((m, choice.kernel, choice.split))  # KernelChoice: no split on a GEMV-like kernel
        if m >= rows:
            break
    return out


def gv_configs_of(texts: list[str]) -> list[str]:
    """The shared-memory-ring GEMV configs (GV_CONFIGS) that any of the linears' ``w4a16_kernels``
    names: what the artifact's ``w4a16.fatbin`` must hold besides the rule's kernels."""
    return sorted(_named(texts) & set(GV_CONFIGS))


def tile_configs_of(texts: list[str]) -> list[str]:
    """The tensor-core tiles (TC_CONFIGS, MTC_CONFIGS) that any of the linears' ``w4a16_kernels``
    names: the artifact's ``w4a16.fatbin`` holds them too (built for sm_90a)."""
    return sorted(_named(texts) - set(GEMV_LIKE))


def _named(texts: list[str]) -> set[str]:
    return {row[1] for t in texts for rows in parse_rows(t).values() for row in rows}
