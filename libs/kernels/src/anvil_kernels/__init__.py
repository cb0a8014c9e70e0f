"""Anvil kernels: the INT4 weight format and the numba CPU kernel library.

Every op validates its arguments (ValueError naming the constraint), then calls its ``_cpu``
implementation; a CUDA backend plugs in at that seam. Ops write into caller-provided buffers.
"""

from anvil_kernels._openblas import set_blas_threads
from anvil_kernels.attention import attention, masked_softmax
from anvil_kernels.embedding import embedding
from anvil_kernels.export import TinygemmWeight, tinygemm_unpack, to_tinygemm
from anvil_kernels.format import Int4Weight
from anvil_kernels.gemm import int4_linear
from anvil_kernels.importers import from_awq, from_gptq
from anvil_kernels.norm import layer_norm
from anvil_kernels.pooling import mean_pool_l2
from anvil_kernels.quantize import dequantize, quantize
from anvil_kernels.workspace import Workspace

__all__ = [
    "Int4Weight",
    "TinygemmWeight",
    "Workspace",
    "attention",
    "dequantize",
    "embedding",
    "from_awq",
    "from_gptq",
    "int4_linear",
    "layer_norm",
    "masked_softmax",
    "mean_pool_l2",
    "quantize",
    "set_blas_threads",
    "tinygemm_unpack",
    "to_tinygemm",
]
