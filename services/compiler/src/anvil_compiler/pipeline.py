"""The compile pipeline: model bytes -> graph -> fused ops -> weights -> plan -> kernels -> files.

``compile_model`` is what a job runs (in a worker process); ``progress(stage, percent)`` reports
each stage. Every failure is a CompileError naming the stage (and the op/node where there is one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anvil_compiler.errors import CompileError
from anvil_compiler.ir import Graph
from anvil_compiler.lower import Lowered, lower
from anvil_compiler.options import CompileOptions
from anvil_compiler.passes.accuracy import check_accuracy, read_calibration
from anvil_compiler.passes.fuse import fuse
from anvil_compiler.passes.quantize import quantize_graph

__all__ = ["Progress", "compile_graph", "compile_model", "import_model"]

Progress = Callable[[str, float], None]


def _quiet(stage: str, percent: float) -> None:
    return None


def import_model(fmt: str, data: bytes, name: str) -> Graph:
    if fmt == "onnx":
        from anvil_compiler.frontends.onnx import load_onnx

        return load_onnx(data, name)
    if fmt == "hf":
        from anvil_compiler.frontends.hf import load_hf_bundle

        return load_hf_bundle(data, name)
    raise CompileError(f"unknown model format {fmt!r}; formats: onnx, hf", stage="load")


def compile_graph(
    g: Graph, opts: CompileOptions, progress: Progress = _quiet, calibration: bytes = b""
) -> Lowered:
    """``calibration``: ``.npz`` bytes of inputs the accuracy report runs on (passes/accuracy.py)."""
    progress("fuse", 20)
    fuse(g)
    uploaded = read_calibration(calibration, g, opts) if calibration else None
    progress("quantize", 30)
    weights = quantize_graph(g, opts)
    report = None
    if opts.quantize:
        progress("accuracy", 45)
        report = check_accuracy(g, opts, weights, uploaded)  # may keep linears fp32 (error budget)
    progress("plan", 60)
    lowered = lower(g, weights, opts)
    lowered.accuracy = report.to_dict() if report is not None else None
    return lowered


def compile_model(
    fmt: str,
    data: bytes,
    name: str,
    opts: CompileOptions,
    out_dir: Path,
    key: str,
    progress: Progress = _quiet,
    build: bool = True,
    calibration: bytes = b"",
) -> dict[str, Any]:
    """Compile into ``out_dir`` (plan.bin, weights.safetensors, kernels.cu, fatbin/cubins,
    manifest.json); returns the manifest."""
    from anvil_compiler.artifacts import write_artifact
    from anvil_compiler.codegen.build import build_kernels, build_w4a16

    t0 = time.perf_counter()
    progress("import", 5)
    g = import_model(fmt, data, name)
    lowered = compile_graph(g, opts, progress, calibration)
    progress("codegen", 70)
    kernels = build_kernels(lowered.sources, opts.archs, out_dir) if build else {}
    if build:
        w4a16, why = build_w4a16(
            lowered.stats.get("w4a16_groups", []),
            opts.archs,
            out_dir,
            gv_configs=lowered.stats.get("w4a16_gv_configs", []),
            tile_configs=lowered.stats.get("w4a16_tile_configs", []),
            dtype=lowered.stats.get("gpu_precision", "fp16"),
        )
        kernels.update(w4a16)
        if why:
            lowered.stats["w4a16_module"] = f"not built: {why}"
    progress("write", 95)
    extra = {}
    if fmt == "hf":
        from anvil_compiler.frontends.hf import assets

        extra = assets(data)  # tokenizer.json and sentence-transformers configs, kept for serving
    manifest = write_artifact(out_dir, key, name, lowered, kernels, opts, time.perf_counter() - t0, extra)
    progress("done", 100)
    return manifest
