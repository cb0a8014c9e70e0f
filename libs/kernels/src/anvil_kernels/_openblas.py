"""The cblas_sgemm of the OpenBLAS that numpy itself loaded, callable from numba kernels.

Why: the INT4 GEMM for larger M (gemm_tiled.py) calls a single-threaded sgemm from inside each
numba task. Calling numpy's matmul between numba parallel regions instead makes the two thread
pools take turns, and each one's spinning idle threads starve the other (measured 20-60x slower
on 2 cores). No extra dependency: numpy's wheels bundle OpenBLAS under ``numpy.libs``; where numpy
uses another BLAS (distro build, MKL, Accelerate) ``SGEMM`` is None and callers use the pure-numba
kernel.

Thread count: during a call, ``single_threaded()`` sets OpenBLAS to one thread (the parallelism
comes from numba's threads) and restores it after, under a lock, so concurrent callers cannot
leave it at one. numpy matmuls in other Python threads run single-threaded meanwhile.
"""

from __future__ import annotations

import ctypes
import glob
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROW_MAJOR = 101  # CBLAS_ORDER / CBLAS_TRANSPOSE enum values
NO_TRANS = 111

# (library glob, sgemm, set_num_threads, get_num_threads): numpy >= 2 wheels, then numpy 1.26 wheels;
# both are ILP64 builds (64-bit integer arguments).
_CANDIDATES = (
    (
        "libscipy_openblas64_*.so*",
        "scipy_cblas_sgemm64_",
        "scipy_openblas_set_num_threads64_",
        "scipy_openblas_get_num_threads64_",
    ),
    ("libopenblas64_*.so*", "cblas_sgemm64_", "openblas_set_num_threads64_", "openblas_get_num_threads64_"),
)
_lock = threading.Lock()


def _load() -> tuple[Any, Any, Any] | None:
    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for pattern, sgemm_name, set_name, get_name in _CANDIDATES:
        for path in sorted(glob.glob(str(libdir / pattern))):
            try:
                lib = ctypes.CDLL(path)  # already loaded by numpy: same handle, no second copy
                sgemm, set_threads, get_threads = (getattr(lib, n) for n in (sgemm_name, set_name, get_name))
            except (OSError, AttributeError):
                continue
            i32, i64, f32, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
            # order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc
            sgemm.argtypes = [i32, i32, i32, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64]
            sgemm.restype = None
            set_threads.argtypes = [ctypes.c_int]
            set_threads.restype = None
            get_threads.argtypes = []
            get_threads.restype = ctypes.c_int
            return sgemm, set_threads, get_threads
    return None


_FOUND = _load()
SGEMM: Any = None if _FOUND is None else _FOUND[0]


@contextmanager
def single_threaded() -> Iterator[None]:
    """OpenBLAS at one thread for the duration (a no-op where SGEMM is None)."""
    if _FOUND is None:
        yield
        return
    _, set_threads, get_threads = _FOUND
    with _lock:
        before = get_threads()
        set_threads(1)
        try:
            yield
        finally:
            set_threads(before)


def set_blas_threads(n: int) -> bool:
    """Set numpy's OpenBLAS thread count for the process; False where numpy uses another BLAS."""
    if n < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {n}")
    if _FOUND is None:
        return False
    with _lock:
        _FOUND[1](n)
    return True
