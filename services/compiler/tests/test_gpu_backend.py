"""Which backend an INT4 linear of an fp16 GPU plan gets (codegen/gpu_backend.py): the W4A16 kernels
up to W4A16_MAX_M rows by the rule, fewer (or none) where the measured table kept with the kernels
for one of the plan's archs has cuBLAS on dense weights faster at that shape."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_compiler.codegen.gpu_backend import W4A16_MAX_M, gv_configs_of, linear_backend
from anvil_kernels.cuda import packaged_table

_TABLE_W4A16 = {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "table sm_90"}


def _int4(k: int, n: int) -> dict[str, np.ndarray]:
    return {"packed": np.zeros((k // 2, n), np.uint8)}  # K/2 bytes of two nibbles per column


@pytest.mark.parametrize(
    ("k", "n", "want"),
    [
        (384, 1152, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM qkv
        (384, 1536, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM fc1
        (1536, 384, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:16=gvb8w"}),  # MiniLM fc2
        (8192, 8192, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:1=gvb8w,4=gemv,16=gemv"}),
        (14336, 4096, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:1=gemv,4=gemv,16=gemv"}),
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


def test_the_recorded_kernels_are_the_tables_choices_up_to_w4a16_max_m() -> None:
    table = packaged_table("sm_90")
    assert table is not None
    for (k, n), entries in table.entries.items():
        got = linear_backend(_int4(k, n), 128, "fp16", ("sm_90",))
        if got["gpu_backend"] != "w4a16":
            continue
        rows = got["w4a16_kernels"].removeprefix("sm_90:").split(",")
        want = []
        for m, choice in entries:  # every measured row that decides some M in 1..w4a16_max_m
            want.append(f"{m}={choice.kernel}")
            if m >= got["w4a16_max_m"]:
                break
        assert rows == want, (k, n)


def test_the_w4a16_build_gets_the_ring_gemvs_the_rows_name() -> None:
    texts = [
        linear_backend(_int4(k, n), 128, "fp16", ("sm_90",))["w4a16_kernels"]
        for k, n in ((8192, 8192), (14336, 4096))
    ]
    assert gv_configs_of(texts) == ["gvb8w"]  # 14336x4096 names only the rule's gemv
    assert gv_configs_of(texts[1:]) == []
