"""Accuracy contract of each op against a float64 numpy reference (tabled in docs/int4.md).

The CPU kernels are tested against these; a future CUDA twin is tested against the CPU kernels
with the same numbers. Forms:
- MATMUL_RTOL: |out - ref| <= MATMUL_RTOL * (|x| @ |W|) + ATOL elementwise, where |W| is the
  magnitude of the dequantized weight and ref uses the same dequantized weight (quantization
  error itself is not counted: it is bounded separately by RTN_SLACK).
- *_ATOL / *_RTOL elsewhere: numpy.allclose form |out - ref| <= atol + rtol * |ref|.
"""

from __future__ import annotations

RTN_SLACK = 1e-6  # |dequant - w| <= scale / 2 * (1 + RTN_SLACK) + 1e-7 * |w|  (float32 rounding)
MATMUL_RTOL = 2e-6  # int4_linear accumulation in float32, relative to |x| @ |W|
MATMUL_ATOL = 1e-6
ACT_RTOL = 1e-5  # fused epilogue (activation in float64, stored float32)
LAYER_NORM_ATOL = 1e-5
LAYER_NORM_RTOL = 1e-5
SOFTMAX_ATOL = 1e-6
SOFTMAX_RTOL = 1e-5
ATTENTION_ATOL = 1e-5
ATTENTION_RTOL = 1e-4
POOL_ATOL = 1e-6
POOL_RTOL = 1e-5
