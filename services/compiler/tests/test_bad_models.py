"""Bad models fail with a clear CompileError naming the op / node (no torch needed)."""

from __future__ import annotations

import pytest
from onnx_models import mismatched_bytes, mlp_bytes

from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.onnx import load_onnx
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_graph


def test_unsupported_op_names_op_and_node() -> None:
    with pytest.raises(CompileError, match=r"unsupported op Selu \(node 'act'\)"):
        load_onnx(mlp_bytes(op="Selu"))


def test_truncated_file_is_a_load_error() -> None:
    data = mlp_bytes()
    with pytest.raises(CompileError) as err:
        load_onnx(data[: len(data) // 2])
    assert err.value.stage == "load"


def test_shape_mismatch_names_node() -> None:
    with pytest.raises(CompileError, match=r"MatMul \(node 'fc2_bad'\).*mismatch"):
        load_onnx(mismatched_bytes())


def test_op_without_kernel_after_fusion_names_node() -> None:
    g = load_onnx(mlp_bytes(op="Erf"))  # imports (Erf is known) but no kernel computes a bare Erf
    with pytest.raises(CompileError, match=r"op Erf \(node 'act'\)"):
        compile_graph(g, CompileOptions())
