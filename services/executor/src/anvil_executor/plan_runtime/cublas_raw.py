"""cuBLAS called through ctypes, so a GEMM can be recorded into a CUDA graph.

CuPy refuses any cuBLAS call while a stream is capturing ("calling cuBLAS API during stream capture
is currently unsupported", measured on the H200 with CuPy's matmul), although cuBLAS itself supports
capture when it is given its workspace. ``Gemm`` owns one cuBLAS handle bound to the model's stream
and a workspace in the model's arena, and runs row-major ``C (M, N) = A (M, K) @ B (K, N)``: fp32 in
and out with fp32 or TF32 tensor-core compute, or (``dtype="fp16"`` / ``"bf16"``) fp16 / bf16 in and
out with fp32 accumulation on the tensor cores. Nothing is allocated per call, so it captures.
"""

from __future__ import annotations

import ctypes

__all__ = ["Gemm", "load_cublas"]

CUDA_R_32F = 0
CUDA_R_16F = 2
CUDA_R_16BF = 14
DATA_TYPES = {"fp32": CUDA_R_32F, "fp16": CUDA_R_16F, "bf16": CUDA_R_16BF}
CUBLAS_OP_N = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1


def load_cublas() -> ctypes.CDLL:
    """libcublas as CuPy found it (cuda-pathfinder), else by its soname."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("cublas").abs_path
        if path:
            return ctypes.CDLL(path)
    except Exception:  # no pathfinder, or it found nothing: try the loader's own search
        pass
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublas not found (CuPy's CUDA libraries are missing)")


class Gemm:
    """One cuBLAS handle on one stream, with a fixed workspace."""

    def __init__(
        self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int, tf32: bool, dtype: str = "fp32"
    ) -> None:
        if dtype not in DATA_TYPES:
            raise ValueError(f"dtype must be one of {tuple(DATA_TYPES)}, got {dtype!r}")
        self._lib = lib = load_cublas()
        self._handle = ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._check(lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        ws = ctypes.c_void_p(workspace_ptr), ctypes.c_size_t(workspace_bytes)
        self._check(lib.cublasSetWorkspace_v2(self._handle, *ws), "cublasSetWorkspace")
        # fp16 / bf16: fp32 accumulation (CUBLAS_COMPUTE_32F with 16F / 16BF operands: tensor cores)
        self._compute = CUBLAS_COMPUTE_32F_FAST_TF32 if tf32 and dtype == "fp32" else CUBLAS_COMPUTE_32F
        self._type = DATA_TYPES[dtype]
        self.dtype = dtype
        self._one = ctypes.c_float(1.0)
        self._zero = ctypes.c_float(0.0)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: cuBLAS status {status}")

    def __call__(self, a: int, b: int, c: int, m: int, n: int, k: int) -> None:
        """Row-major C (m, n) = A (m, k) @ B (k, n), device pointers, all of ``self.dtype``.

        Column-major cuBLAS sees C^T = B^T A^T: B as an (n x k) matrix with ld n, A as (k x m) with
        ld k, C as (n x m) with ld n.
        """
        lib = self._lib
        st = lib.cublasGemmEx(
            self._handle,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            ctypes.c_int(n),
            ctypes.c_int(m),
            ctypes.c_int(k),
            ctypes.byref(self._one),
            ctypes.c_void_p(b),
            self._type,
            ctypes.c_int(n),
            ctypes.c_void_p(a),
            self._type,
            ctypes.c_int(k),
            ctypes.byref(self._zero),
            ctypes.c_void_p(c),
            self._type,
            ctypes.c_int(n),
            self._compute,
            CUBLAS_GEMM_DEFAULT,
        )
        self._check(st, "cublasGemmEx")

    def close(self) -> None:
        if self._handle:
            self._lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
