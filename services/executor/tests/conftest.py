"""The GPU runtime's host path without a GPU: ``fake`` replaces CuPy, cuBLAS and cuBLASLt with the
stand-ins of ``fake_cupy`` (no kernel runs; every launch is recorded) for one test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fake_cupy


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """CuPy, cuBLAS and cuBLASLt replaced for the test; returns the fake cuBLAS library."""
    from anvil_executor.plan_runtime import cublas_raw, cublaslt_raw, gpu_model
    from anvil_executor.plan_runtime.cuda_arena import counter

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.make_module())
    lib = fake_cupy.FakeCublas()
    monkeypatch.setattr(cublas_raw, "load_cublas", lambda: lib)
    monkeypatch.setattr(cublaslt_raw, "load_cublaslt", lambda: lib)
    monkeypatch.setattr(counter, "_installed", False)
    monkeypatch.setattr(gpu_model.GpuPlanModel, "_epilogue_module", None)
    monkeypatch.setattr(gpu_model.GpuPlanModel, "_epilogue_f16_module", None)
    fake_cupy.LAUNCHES.calls.clear()
    return lib
