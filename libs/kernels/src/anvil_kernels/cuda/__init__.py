"""CUDA kernels for Anvil (sm_90). CuPy is imported lazily, only where a GPU call is made.

``PLAN_COMMON``: the device helpers (fp16 loads, activations, block reductions) that every compiled
plan kernel and the executor's GPU epilogue include, kept in one file.
"""

from pathlib import Path

from anvil_kernels.cuda.w4a16 import (
    LaunchPlan,
    Variant,
    W4A16Params,
    build_fatbin,
    build_fatbins,
    plan_gv,
    plan_launch,
    prepack,
    unprepack,
    w4a16_source,
)
from anvil_kernels.cuda.w4a16_dispatch import DispatchTable, KernelChoice, choose, packaged_table
from anvil_kernels.cuda.w4a16_gv import GV_CONFIGS, GvConfig
from anvil_kernels.cuda.w4a16_linear import OPS, ModuleSet, W4A16Linear, int4_linear_cuda, load_module
from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS, MtcConfig, plan_mtc, prepack_mtc, unprepack_mtc
from anvil_kernels.cuda.w4a16_tc import TC_CONFIGS, TcConfig, TcPlan, plan_tc

PLAN_COMMON = Path(__file__).with_name("plan_common.cuh")

__all__ = [
    "GV_CONFIGS",
    "MTC_CONFIGS",
    "OPS",
    "PLAN_COMMON",
    "TC_CONFIGS",
    "DispatchTable",
    "GvConfig",
    "KernelChoice",
    "LaunchPlan",
    "ModuleSet",
    "MtcConfig",
    "TcConfig",
    "TcPlan",
    "Variant",
    "W4A16Linear",
    "W4A16Params",
    "build_fatbin",
    "build_fatbins",
    "choose",
    "int4_linear_cuda",
    "load_module",
    "packaged_table",
    "plan_gv",
    "plan_launch",
    "plan_mtc",
    "plan_tc",
    "prepack",
    "prepack_mtc",
    "unprepack",
    "unprepack_mtc",
    "w4a16_source",
]
