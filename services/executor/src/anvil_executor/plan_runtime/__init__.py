"""Runs compiled Anvil artifacts (plan + INT4 weights) on the CPU with the anvil_kernels numba ops.

`PlanModel.load(artifact_dir)` gives an executor `Model`; `HostArena` is the bank-partitioned
host memory it runs in (the same API a device arena offers).
"""

from anvil_executor.plan_runtime.arena import HostArena
from anvil_executor.plan_runtime.model import PlanModel
from anvil_executor.plan_runtime.plan import PLAN_VERSION, LoadedPlan, load_plan

__all__ = ["PLAN_VERSION", "HostArena", "LoadedPlan", "PlanModel", "load_plan"]
