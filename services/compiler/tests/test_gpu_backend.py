"""Which backend an INT4 linear of an fp16 GPU plan gets (codegen/gpu_backend.py): the W4A16 kernels
up to W4A16_MAX_M rows by the rule, fewer (or none) where the measured table kept with the kernels
for one of the plan's archs has cuBLAS on dense weights faster at that shape."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_compiler.codegen.gpu_backend import W4A16_MAX_M, linear_backend


def _int4(k: int, n: int) -> dict[str, np.ndarray]:
    return {"packed": np.zeros((k // 2, n), np.uint8)}  # K/2 bytes of two nibbles per column


@pytest.mark.parametrize(
    ("k", "n", "want"),
    [
        (384, 1152, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM qkv
        (384, 1536, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM fc1
        (1536, 384, {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "table sm_90"}),
        (8192, 8192, {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "table sm_90"}),
        (512, 256, {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "rule"}),  # unmeasured
    ],
)
def test_int4_linears_follow_the_measured_table(k: int, n: int, want: dict) -> None:
    assert linear_backend(_int4(k, n), 128, "fp16", ("sm_80", "sm_90")) == want


def test_without_a_measured_arch_the_rule_decides() -> None:
    got = linear_backend(_int4(384, 1152), 128, "fp16", ("sm_80",))  # sm_80 was never measured
    assert got == {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "rule"}


def test_other_linears_are_unchanged() -> None:
    assert linear_backend({"weight": np.zeros((384, 1152), np.float32)}, 0, "fp16", ("sm_90",)) == {
        "gpu_backend": "cublas_f16"
    }
    assert linear_backend(_int4(384, 1152), 128, "fp32", ("sm_90",)) == {"gpu_backend": "plan_int4"}
    assert linear_backend(_int4(384, 1152), 32, "fp16", ("sm_90",)) == {"gpu_backend": "cublas_f16_dequant"}
