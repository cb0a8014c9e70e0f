"""cuBLASLt through ctypes: an fp16 (or bf16) GEMM whose epilogue adds the bias (and ReLU or tanh-GELU), so
a linear with no residual and no LayerNorm needs no separate epilogue pass (``ANVIL_GPU_LT_EPILOGUE``,
off by default until measured per shape on the H200).

Row-major ``D (M, N) = act(A (M, K) @ B (K, N) + bias)``, fp16 in and out, fp32 accumulation. cuBLASLt
is column-major: it computes D^T (N x M) = B^T (N x K) . A^T (K x M), i.e. its "A" is our B with
ld N and its "B" is our A with ld K; the bias runs along D^T's rows (N), as cuBLASLt's bias does.
cuBLASLt's GELU epilogue is the tanh approximation: only ``gelu_tanh`` linears take it.

Descriptors, layouts and the heuristic's algorithm are host objects made once per (op, M) (at graph
capture) and kept; a call only enqueues the matmul with the workspace in the model's arena, so it
captures into a CUDA graph like ``cublas_raw.Gemm``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

__all__ = ["LT_EPILOGUES", "LtGemm", "load_cublaslt"]

CUDA_R_16F = 2
CUDA_R_16BF = 14
CUDA_R_32F = 0
CUBLAS_COMPUTE_32F = 68
DESC_EPILOGUE = 7  # cublasLtMatmulDescAttributes_t
DESC_BIAS_POINTER = 8
PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
HEURISTIC_RESULT_BYTES = (
    256  # cublasLtMatmulHeuristicResult_t is 96 bytes: algo (64) first, then its workspace size
)
# act name -> cublasLtEpilogue_t with bias
LT_EPILOGUES = {"none": 4, "relu": 6, "gelu_tanh": 36}


def load_cublaslt() -> ctypes.CDLL:
    """libcublasLt as CuPy found it (cuda-pathfinder), else by its soname."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("cublasLt").abs_path
        if path:
            return ctypes.CDLL(path)
    except Exception:  # no pathfinder, or it found nothing: try the loader's own search
        pass
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublasLt not found (CuPy's CUDA libraries are missing)")


@dataclass(slots=True)
class _Plan:
    desc: ctypes.c_void_p
    a: ctypes.c_void_p  # cuBLASLt's A: our weight (N x K col-major)
    b: ctypes.c_void_p  # cuBLASLt's B: our x (K x M col-major)
    d: ctypes.c_void_p  # D: our out (N x M col-major)
    heuristic: ctypes.Array[ctypes.c_char]


class LtGemm:
    """One cuBLASLt handle for one model's stream, with the model's workspace."""

    def __init__(
        self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int, dtype: str = "fp16"
    ) -> None:
        if dtype not in ("fp16", "bf16"):
            raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
        self._type = CUDA_R_16F if dtype == "fp16" else CUDA_R_16BF  # A, B, D and the bias
        self._lib = lib = load_cublaslt()
        self._handle = ctypes.c_void_p()
        self._check(lib.cublasLtCreate(ctypes.byref(self._handle)), "cublasLtCreate")
        self._stream = ctypes.c_void_p(stream_ptr)
        self._ws = ctypes.c_void_p(workspace_ptr)
        self._ws_bytes = ctypes.c_size_t(workspace_bytes)
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._plans: dict[tuple[int, int, int, int, int], _Plan] = {}
        self._none: set[tuple[int, int, int, int, int]] = set()  # shapes with no algorithm

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: cuBLAS status {status}")

    def _layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        st = self._lib.cublasLtMatrixLayoutCreate(
            ctypes.byref(out), self._type, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)
        )
        self._check(st, "cublasLtMatrixLayoutCreate")
        return out

    def _plan(self, m: int, n: int, k: int, bias: int, epilogue: int) -> _Plan:
        key = (m, n, k, bias, epilogue)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        lib = self._lib
        desc = ctypes.c_void_p()
        self._check(
            lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate"
        )
        epi = ctypes.c_int32(epilogue)
        st = lib.cublasLtMatmulDescSetAttribute(desc, DESC_EPILOGUE, ctypes.byref(epi), ctypes.sizeof(epi))
        self._check(st, "DescSetAttribute(EPILOGUE)")
        bptr = ctypes.c_void_p(bias)
        st = lib.cublasLtMatmulDescSetAttribute(
            desc, DESC_BIAS_POINTER, ctypes.byref(bptr), ctypes.sizeof(bptr)
        )
        self._check(st, "DescSetAttribute(BIAS_POINTER)")
        a, b, d = self._layout(n, k, n), self._layout(k, m, k), self._layout(n, m, n)
        pref = ctypes.c_void_p()
        self._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(self._ws_bytes.value)
        st = lib.cublasLtMatmulPreferenceSetAttribute(
            pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), ctypes.sizeof(ws)
        )
        self._check(st, "PreferenceSetAttribute")
        heuristic = ctypes.create_string_buffer(HEURISTIC_RESULT_BYTES)
        found = ctypes.c_int(0)
        st = lib.cublasLtMatmulAlgoGetHeuristic(
            self._handle, desc, a, b, d, d, pref, 1, heuristic, ctypes.byref(found)
        )
        lib.cublasLtMatmulPreferenceDestroy(pref)
        self._check(st, "cublasLtMatmulAlgoGetHeuristic")
        if found.value < 1:
            self._none.add(key)
            raise RuntimeError(f"cuBLASLt has no algorithm for {m}x{n}x{k} with epilogue {epilogue}")
        plan = _Plan(desc, a, b, d, heuristic)
        self._plans[key] = plan
        return plan

    def supports(self, m: int, n: int, k: int, bias: int, epilogue: int) -> bool:
        """Whether cuBLASLt has an algorithm for this GEMM and epilogue (the plan made and kept now,
        at capture; a shape without one is remembered and runs cuBLAS + the epilogue kernel instead)."""
        key = (m, n, k, bias, epilogue)
        if key in self._none:
            return False
        try:
            self._plan(m, n, k, bias, epilogue)
        except RuntimeError:
            if key in self._none:
                return False
            raise
        return True

    def __call__(self, x: int, w: int, out: int, m: int, n: int, k: int, bias: int, epilogue: int) -> None:
        """Row-major out (m, n) = epilogue(x (m, k) @ w (k, n) + bias (n,)), device pointers, fp16 / bf16."""
        p = self._plan(m, n, k, bias, epilogue)
        st = self._lib.cublasLtMatmul(
            self._handle, p.desc, ctypes.byref(self._one),
            ctypes.c_void_p(w), p.a, ctypes.c_void_p(x), p.b,
            ctypes.byref(self._zero), ctypes.c_void_p(out), p.d, ctypes.c_void_p(out), p.d,
            p.heuristic, self._ws, self._ws_bytes, self._stream,
        )  # fmt: skip
        self._check(st, "cublasLtMatmul")
