"""CUDA kernels for Anvil (sm_90). CuPy is imported lazily, only where a GPU call is made."""

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

__all__ = [
    "OPS",
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
