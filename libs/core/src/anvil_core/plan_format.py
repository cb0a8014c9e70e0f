"""The compiled plan's format, shared by its one writer (the compiler's ``lower``) and its one reader
(the executor's ``plan_runtime``): the schema version, the dtype tables and the activation codes that
the plan's kernels branch on. The schema itself is ``proto/plan.fbs`` (``anvil_core.proto_gen``)."""

from __future__ import annotations

import numpy as np

from anvil_core.proto_gen import plan_generated as pg

__all__ = ["ACT_CODES", "DTYPES", "DTYPE_CODES", "HALF_KERNEL_ATTRS", "HALF_LINEAR_BACKENDS", "PLAN_VERSION"]

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

# A plan's GPU precision is recorded per op (docs/executor_gpu.md, "Precision"): for a half precision,
# every op but the linears names its kernel variant in this attr (same launch, activations stored in
# that type, fp32 arithmetic) ...
HALF_KERNEL_ATTRS: dict[str, str] = {"fp16": "kernel_f16", "bf16": "kernel_bf16"}
# ... and every linear's ``gpu_backend`` attr says what runs it: cuBLAS on half weights ("cublas"),
# the W4A16 kernels up to ``w4a16_max_m`` rows then cuBLAS on the weights dequantized at load
# ("w4a16"), or cuBLAS on the dequantized weights for every M ("dequant"). fp32 plans record
# "cublas_tf32" / "plan_int4".
HALF_LINEAR_BACKENDS: dict[str, dict[str, str]] = {
    "fp16": {"cublas": "cublas_f16", "w4a16": "w4a16", "dequant": "cublas_f16_dequant"},
    "bf16": {"cublas": "cublas_bf16", "w4a16": "w4a16_bf16", "dequant": "cublas_bf16_dequant"},
}
