"""Accuracy contract of each op against a float64 numpy reference (tabled in docs/int4.md).

The CPU kernels are tested against these; a future CUDA twin is tested against the CPU kernels
with the same numbers. Forms:
- MATMUL_RTOL: |out - ref| <= MATMUL_RTOL * (|x| @ |W|) + ATOL elementwise, where |W| is the
  magnitude of the dequantized weight and ref uses the same dequantized weight (quantization
  error itself is not counted: it is bounded separately by RTN_SLACK).
- GEMV_X_GROUP_RTOL (the M = 1 kernel on AVX-512 VNNI CPUs, which writes x in fixed point per
  group): adds GEMV_X_GROUP_RTOL * sum_g (max_{k in g} |x_k|) * (sum_{k in g} |W_kn|) to the
  MATMUL bound: each x is rounded by at most that fraction of its group's largest |x|.
  It matters only where one x of a group dwarfs the others and meets small weights.
- *_ATOL / *_RTOL elsewhere: numpy.allclose form |out - ref| <= atol + rtol * |ref|.
"""

from __future__ import annotations

RTN_SLACK = 1e-6  # |dequant - w| <= scale / 2 * (1 + RTN_SLACK) + 1e-7 * |w|  (float32 rounding)
MATMUL_RTOL = 2e-6  # int4_linear accumulation in float32, relative to |x| @ |W|
MATMUL_ATOL = 1e-6
GEMV_X_GROUP_RTOL = 2.0**-30  # VNNI GEMV: |x_fixed - x| <= this * max |x| of the group
ACT_RTOL = 1e-5  # fused epilogue (activation in float64, stored float32)
LAYER_NORM_ATOL = 1e-5
LAYER_NORM_RTOL = 1e-5
SOFTMAX_ATOL = 1e-6
SOFTMAX_RTOL = 1e-5
ATTENTION_ATOL = 1e-5
ATTENTION_RTOL = 1e-4
POOL_ATOL = 1e-6
POOL_RTOL = 1e-5
