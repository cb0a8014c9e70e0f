"""Every CUDA kernel both test plans use (INT4 and fp32, MLP and BERT) compiles for sm_90 (and
sm_80) with nvcc; skipped where nvcc is absent."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is a test-only package that .ci/run installs (CPU wheel); not in the uv lock"
)

from torch_models import export_bert, export_mlp  # noqa: E402

from anvil_compiler.codegen.build import build_kernels  # noqa: E402
from anvil_compiler.errors import CompileError  # noqa: E402
from anvil_compiler.frontends.onnx import load_onnx  # noqa: E402
from anvil_compiler.options import CompileOptions  # noqa: E402
from anvil_compiler.pipeline import compile_graph  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_all_templates_of_both_plans_compile(tmp_path: Path) -> None:
    sources: dict[str, str] = {}
    models = [export_mlp(tmp_path / "mlp.onnx"), export_bert(tmp_path / "bert.onnx")]
    for path in models:
        for quantize in (True, False):
            low = compile_graph(
                load_onnx(path),
                CompileOptions(quantize=quantize, max_batch=8, max_seq=32, max_rel_error=None),
            )
            sources.update(low.sources)
    kinds = {name.split("_")[1] for name in sources}
    assert {"linear", "attention", "embed"} <= kinds
    files = build_kernels(sources, ("sm_80", "sm_90"), tmp_path / "out")
    fatbin = tmp_path / "out" / files["fatbin"]
    assert fatbin.stat().st_size > 1000
    assert (tmp_path / "out" / "kernels.cu").read_text().count("__global__") == len(sources)


def test_nvcc_error_comes_back_whole(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as err:
        build_kernels(
            {"broken": 'extern "C" __global__ void broken() { undefined_symbol(); }'}, ("sm_90",), tmp_path
        )
    assert "undefined_symbol" in err.value.detail and (tmp_path / "kernels.cu").exists()
