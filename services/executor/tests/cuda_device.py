"""The first lines of a GPU test module: CuPy and a CUDA device, or the whole module skipped with the
reason (no CuPy installed, no driver, no device). The tests are also marked ``gpu`` (make test-gpu)."""

from __future__ import annotations

from typing import Any

import pytest


def cupy_or_skip() -> Any:
    """The cupy module when a CUDA device answers; otherwise skip the calling module."""
    cp = pytest.importorskip("cupy", reason="the GPU backend needs CuPy")
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver
        pytest.skip(f"no CUDA device: {exc}", allow_module_level=True)
    if count < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
    return cp
