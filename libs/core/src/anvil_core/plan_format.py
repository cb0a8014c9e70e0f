"""The compiled plan's format, shared by its one writer (the compiler's ``lower``) and its one reader
(the executor's ``plan_runtime``): the schema version, the dtype tables and the activation codes that
the plan's kernels branch on. The schema itself is ``proto/plan.fbs`` (``anvil_core.proto_gen``)."""

from __future__ import annotations

import numpy as np

from anvil_core.proto_gen import plan_generated as pg

__all__ = ["ACT_CODES", "DTYPES", "DTYPE_CODES", "PLAN_VERSION"]

PLAN_VERSION = 1  # the writer stamps it, the reader refuses any other

# plan dtype -> numpy scalar type (the reader's table)
DTYPES: dict[int, type] = {
    pg.DType.F32: np.float32,
    pg.DType.F16: np.float16,
    pg.DType.I32: np.int32,
    pg.DType.I64: np.int64,
    pg.DType.U8: np.uint8,
    pg.DType.BOOL: np.bool_,
}
# numpy dtype name -> plan dtype (the writer's table: the inverse of DTYPES)
DTYPE_CODES: dict[str, int] = {np.dtype(t).name: code for code, t in DTYPES.items()}

# an op's ``act`` attr -> the code its kernels branch on (the compiler's CUDA templates and
# plan_common.cuh, the executor's CPU ops and epilogues; the W4A16 kernels take the first five,
# anvil_kernels.activations.ACTIVATIONS)
ACT_CODES: dict[str, int] = {
    "none": 0,
    "relu": 1,
    "gelu_erf": 2,
    "gelu_tanh": 3,
    "silu": 4,
    "sigmoid": 5,
    "tanh": 6,
}
