"""A compiler with no CUDA compiler (the compose image: no nvcc, no cuda-python) still deploys: the
artifact carries kernels.cu and no binaries, and a CPU executor serves it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx_models import mlp_bytes

from anvil_compiler.codegen import build
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model
from anvil_executor.plan_runtime.model import PlanModel


@pytest.fixture
def no_cuda_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(build.shutil, "which", lambda cmd, *a: None if cmd == "nvcc" else real_which(cmd, *a))
    monkeypatch.setitem(sys.modules, "cuda", None)  # `from cuda.bindings import nvrtc` raises ImportError
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)


def test_build_without_a_cuda_compiler_keeps_the_source_only(no_cuda_compiler: None, tmp_path: Path) -> None:
    files = build.build_kernels({"k": 'extern "C" __global__ void k() {}'}, ("sm_90",), tmp_path)
    assert files == {}
    assert "__global__ void k()" in (tmp_path / "kernels.cu").read_text()
    assert not list(tmp_path.glob("*.fatbin")) and not list(tmp_path.glob("*.cubin"))


def test_cpu_deploy_compiles_and_serves_without_a_cuda_compiler(
    no_cuda_compiler: None, tmp_path: Path
) -> None:
    data = mlp_bytes(seed=3)
    opts = CompileOptions(quantize=False, max_batch=8, max_seq=32)
    manifest = compile_model("onnx", data, "m", opts, tmp_path, "key0")
    assert manifest["kernels"] == {}
    assert (tmp_path / "kernels.cu").is_file()
    model = PlanModel.load(tmp_path, "m")
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    (y,) = model.forward({"x": x}).values()
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(data).graph.initializer}
    ref = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
