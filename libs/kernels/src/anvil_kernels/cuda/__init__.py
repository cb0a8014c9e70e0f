"""CUDA kernels for Anvil (sm_90). CuPy is imported lazily, only where a GPU call is made.

``PLAN_COMMON``: the device helpers (fp16 loads, activations, block reductions) that every compiled
plan kernel and the executor's GPU epilogue include, kept in one file.
"""

from pathlib import Path

from anvil_kernels.cuda.w4a16 import (
    OPS,
    LaunchPlan,
    Variant,
    W4A16Linear,
    W4A16Params,
    build_fatbin,
    int4_linear_cuda,
    load_module,
    plan_launch,
    prepack,
    unprepack,
    w4a16_source,
)

PLAN_COMMON = Path(__file__).with_name("plan_common.cuh")

__all__ = [
    "OPS",
    "PLAN_COMMON",
    "LaunchPlan",
    "Variant",
    "W4A16Linear",
    "W4A16Params",
    "build_fatbin",
    "int4_linear_cuda",
    "load_module",
    "plan_launch",
    "prepack",
    "unprepack",
    "w4a16_source",
]
