"""fp32 linears of a GPU plan on cuBLAS (tensor cores through TF32), with the plan's fused epilogue.

The compiler's generic ``linear.cu`` runs on CUDA cores; for an unquantized fp32 linear cuBLAS is far
faster (MiniLM's linears are >90% of its FLOPs). A ``GemmStep`` replaces such an op's launch:

    tmp (M, N) = x (M, K) @ W (K, N)                 cuBLAS (cublas_raw.Gemm) into the workspace bank
    out (M, N) = LN?(act(tmp + bias) + residual)      one epilogue kernel (epilogue_launch picks it)

the same semantics as the op's CPU twin (``ops.linear``). INT4 linears keep the plan's kernel. The
epilogue source (``PLAN_COMMON``'s helpers, shared with the compiler's kernels, plus one kernel) is
compiled once per process (NVRTC) and counted as a module load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from anvil_core.plan_format import ACT_CODES
from anvil_executor.plan_runtime.io import _l
from anvil_executor.plan_runtime.plan import DTYPES, _s, attrs_of, eval_dim
from anvil_kernels.cuda import PLAN_COMMON

__all__ = ["EPILOGUE_SOURCE", "GemmStep", "epilogue_launch", "gemm_ops"]

EPILOGUE_SOURCE = (
    PLAN_COMMON.read_text()
    + r"""
// out[row] = LN?(act(tmp[row] + bias) + res[row]); one block per row, buf: n floats of smem when ln.
extern "C" __global__ void anvil_gemm_epilogue(const float* tmp, const float* bias, const float* res,
    const float* gamma, const float* beta, float* out, int n, int act, int ln, float eps) {
  extern __shared__ float buf[];
  __shared__ float red[32];
  const long base = (long)blockIdx.x * n;
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = tmp[base + i] + (bias ? bias[i] : 0.f);
    v = anvil_act(v, act);
    if (res) v += res[base + i];
    if (ln) buf[i] = v; else out[base + i] = v;
    sum += v;
  }
  if (!ln) return;
  const float mean = anvil_block_sum(sum, red) / n;
  float sq = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) { const float d = buf[i] - mean; sq += d * d; }
  const float inv = rsqrtf(anvil_block_sum(sq, red) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    out[base + i] = (buf[i] - mean) * inv * gamma[i] + beta[i];
}

// No LayerNorm: out = act(tmp + bias) + res over all m * n elements, 4 per thread (n % 4 == 0), a
// grid-stride loop of 16-byte loads and stores (the epilogue is a pure memory pass: QKV and the
// FFN's first linear write 3-4 floats per input float, so its speed is the copy rate).
extern "C" __global__ void anvil_gemm_epilogue_v4(const float4* tmp, const float* bias, const float4* res,
    float4* out, long quads, int n4, int act) {
  for (long q = (long)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += (long)gridDim.x * blockDim.x) {
    float4 v = tmp[q];
    if (bias) {
      const float4 b = reinterpret_cast<const float4*>(bias)[q % n4];
      v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
    }
    v.x = anvil_act(v.x, act); v.y = anvil_act(v.y, act);
    v.z = anvil_act(v.z, act); v.w = anvil_act(v.w, act);
    if (res) {
      const float4 r = res[q];
      v.x += r.x; v.y += r.y; v.z += r.z; v.w += r.w;
    }
    out[q] = v;
  }
}

// With LayerNorm, rows of n <= 32 * ANVIL_LN_VALS: one warp per row, the row in registers, the
// mean and variance by shuffles (no shared memory, no __syncthreads: the block-per-row kernel above
// spent most of its time in its two block reductions).
#define ANVIL_LN_VALS 16
extern "C" __global__ void anvil_gemm_epilogue_ln_warp(const float* tmp, const float* bias, const float* res,
    const float* gamma, const float* beta, float* out, long rows, int n, int act, float eps) {
  const long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const long base = row * n;
  float v[ANVIL_LN_VALS];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < ANVIL_LN_VALS; ++k) {
    const int i = lane + 32 * k;
    float x = 0.f;
    if (i < n) {
      x = tmp[base + i] + (bias ? bias[i] : 0.f);
      x = anvil_act(x, act);
      if (res) x += res[base + i];
    }
    v[k] = x;
    sum += x;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float mean = sum / n;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < ANVIL_LN_VALS; ++k) {
    const float d = (lane + 32 * k < n) ? v[k] - mean : 0.f;
    sq += d * d;
  }
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float inv = rsqrtf(sq / n + eps);
#pragma unroll
  for (int k = 0; k < ANVIL_LN_VALS; ++k) {
    const int i = lane + 32 * k;
    if (i < n) out[base + i] = (v[k] - mean) * inv * gamma[i] + beta[i];
  }
}
"""
)
LN_WARP_MAX_N = 32 * 16  # ANVIL_LN_VALS values per lane
EPILOGUE_THREADS = 256
EPILOGUE_MAX_BLOCKS = 132 * 16  # a few waves of the H200's 132 SMs; the v4 kernel's loop covers the rest


@dataclass(frozen=True, slots=True)
class GemmStep:
    """One fp32 linear: tensor/weight indices and the epilogue's parameters."""

    op_index: int
    x: int  # tensor index (…, K)
    out: int  # tensor index (…, N)
    residual: int  # tensor index or -1
    weight: int  # weight index (K, N) f32
    bias: int  # weight index or -1
    gamma: int
    beta: int
    k: int
    n: int
    act: int
    eps: float

    def rows(self, plan: Any, b: int, t: int) -> int:
        """M at (b, t): every dimension of x but the last."""
        dims = plan.tensors[self.x].shape
        m = 1
        for d in _l(dims)[:-1]:
            m *= eval_dim(d, b, t)
        return m


def gemm_ops(plan: Any) -> list[GemmStep]:
    """The plan's linears that cuBLAS can run: fp32 weight (K, N), no INT4, N within one block's LN."""
    steps: list[GemmStep] = []
    for i, op in enumerate(plan.ops):
        if _s(op.kind) != "linear":
            continue
        w = {_s(r): int(ix) for r, ix in zip(_l(op.weightRoles), _l(op.weights), strict=True)}
        ins = {_s(r): int(ix) for r, ix in zip(_l(op.inputRoles), _l(op.inputs), strict=True)}
        if "weight" not in w or "x" not in ins:
            continue  # INT4 (packed) or an unexpected layout: the plan's kernel runs it
        wi = plan.weights[w["weight"]]
        shape = [int(d) for d in _l(wi.shape)]
        if DTYPES[wi.dtype] is not np.float32 or len(shape) != 2:
            continue
        attrs = attrs_of(op)
        ln = "gamma" in w
        steps.append(
            GemmStep(
                op_index=i,
                x=ins["x"],
                out=int(_l(op.outputs)[0]),
                residual=ins.get("residual", -1),
                weight=w["weight"],
                bias=w.get("bias", -1),
                gamma=w["gamma"] if ln else -1,
                beta=w.get("beta", -1) if ln else -1,
                k=shape[0],
                n=shape[1],
                act=ACT_CODES[str(attrs.get("act", "none"))],
                eps=float(attrs.get("eps", 0.0)) if ln else 0.0,
            )
        )
    return steps


def epilogue_launch(
    step: GemmStep, plan: Any, act_base: int, wts_base: int, tmp: int, m: int
) -> tuple[str, tuple[int, int, int], tuple[int, int, int], int, tuple[Any, ...]]:
    """(kernel, grid, block, shared memory bytes, args) of the epilogue of ``m`` rows: the warp-per-row
    LayerNorm kernel for rows of at most LN_WARP_MAX_N, the float4 kernel without LayerNorm when N is a
    multiple of 4, else the block-per-row kernel (epilogue_args)."""

    def w(ix: int) -> np.uint64:
        return np.uint64(0 if ix < 0 else wts_base + int(plan.weights[ix].offset))

    def a(ix: int) -> np.uint64:
        return np.uint64(0 if ix < 0 else act_base + int(plan.tensors[ix].offset))

    ln = step.gamma >= 0
    if ln and step.n <= LN_WARP_MAX_N:
        warps = EPILOGUE_THREADS // 32
        args: tuple[Any, ...] = (
            np.uint64(tmp),
            w(step.bias),
            a(step.residual),
            w(step.gamma),
            w(step.beta),
            a(step.out),
            np.int64(m),
            np.int32(step.n),
            np.int32(step.act),
            np.float32(step.eps),
        )
        return "anvil_gemm_epilogue_ln_warp", (-(-m // warps), 1, 1), (EPILOGUE_THREADS, 1, 1), 0, args
    aligned = all(int(p) % 16 == 0 for p in (tmp, w(step.bias), a(step.residual), a(step.out)))
    if not ln and step.n % 4 == 0 and aligned:
        quads = m * step.n // 4
        blocks = max(1, min(EPILOGUE_MAX_BLOCKS, -(-quads // EPILOGUE_THREADS)))
        args = (
            np.uint64(tmp),
            w(step.bias),
            a(step.residual),
            a(step.out),
            np.int64(quads),
            np.int32(step.n // 4),
            np.int32(step.act),
        )
        return "anvil_gemm_epilogue_v4", (blocks, 1, 1), (EPILOGUE_THREADS, 1, 1), 0, args
    block, smem, args = epilogue_args(step, plan, act_base, wts_base, tmp)
    return "anvil_gemm_epilogue", (m, 1, 1), block, smem, args


def epilogue_args(
    step: GemmStep, plan: Any, act_base: int, wts_base: int, tmp: int
) -> tuple[tuple[int, int, int], int, tuple[Any, ...]]:
    """(block, shared memory bytes, args) of the block-per-row epilogue; the grid is (rows, 1, 1)."""

    def w(ix: int) -> np.uint64:
        return np.uint64(0 if ix < 0 else wts_base + int(plan.weights[ix].offset))

    def a(ix: int) -> np.uint64:
        return np.uint64(0 if ix < 0 else act_base + int(plan.tensors[ix].offset))

    threads = min(1024, max(32, -(-step.n // 32) * 32))
    ln = step.gamma >= 0
    args = (
        np.uint64(tmp),
        w(step.bias),
        a(step.residual),
        w(step.gamma),
        w(step.beta),
        a(step.out),
        np.int32(step.n),
        np.int32(step.act),
        np.int32(int(ln)),
        np.float32(step.eps),
    )
    return (threads, 1, 1), (4 * step.n if ln else 0), args
