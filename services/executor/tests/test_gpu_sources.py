"""The CUDA sources the executor compiles at load with NVRTC (the fp32 and fp16 GEMM epilogues) build for
sm_90 with no header (NVRTC from pip has none) and without register spills. Needs nvcc (CPU only:
nothing runs); skipped without it. Their behaviour is tested on a GPU (test_gpu_plan.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from anvil_executor.plan_runtime.cublas_linear import EPILOGUE_SOURCE
from anvil_executor.plan_runtime.gpu_linear import EPILOGUE_F16_SOURCE

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

SOURCES = {"epilogue_f32": EPILOGUE_SOURCE, "epilogue_f16": EPILOGUE_F16_SOURCE}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_runtime_sources_build_for_sm90_without_headers_or_spills(tmp_path: Path, name: str) -> None:
    src = SOURCES[name]
    assert "#include" not in src  # CuPy's NVRTC compiles it at load, where no CUDA header may exist
    path = tmp_path / f"{name}.cu"
    path.write_text(src)
    cmd = ["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "--use_fast_math", "-Xptxas", "-v"]
    res = subprocess.run([*cmd, "-o", str(tmp_path / "k.cubin"), str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    kernels = set(re.findall(r'extern "C" __global__ void (\w+)', src))
    reported = set(re.findall(r"Function properties for (\w+)", res.stderr))
    assert kernels and kernels <= reported, (kernels, reported)
    spills = [
        int(a) + int(b)
        for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    ]
    assert spills and not any(spills), res.stderr[-3000:]
