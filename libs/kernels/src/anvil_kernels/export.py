"""Export to PyTorch's tinygemm INT4 layout (pure numpy; torch is not a dependency).

Target: the input of the CUDA op ``torch.ops.aten._convert_weight_to_int4pack(weight, innerKTiles)``
followed by ``_weight_int4pack_mm(x, packed, group_size, scales_and_zeros)``:
    weight            uint8 (N, K/2), byte = (q[n, 2k] << 4) | q[n, 2k + 1]  (high nibble = even k)
    scales_and_zeros  (K/g, N, 2): [..., 0] = scale, [..., 1] = zero' = (8 - z) * scale
    tinygemm dequant  W[k, n] = (q - 8) * scale + zero'  ==  Anvil's (q - z) * scale
The CUDA op wants bf16 activations and bf16 scales_and_zeros (``dtype="bf16"``, returned as the
uint16 bit pattern: ``torch.from_numpy(sz).view(torch.bfloat16)``). The CPU op
``_convert_weight_to_int4pack_for_cpu`` instead takes the unpacked int32 (N, K) values:
``tinygemm_unpack(weight)``; ``_weight_int4pack_mm_for_cpu`` accepts float32 scales_and_zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from anvil_kernels import _validate as v
from anvil_kernels.format import Int4Weight, f32_to_bf16_bits, unpack_nibbles


@dataclass(frozen=True, eq=False)
class TinygemmWeight:
    """tinygemm operands; see the module docstring."""

    weight: NDArray[np.uint8]  # (N, K/2)
    scales_and_zeros: np.ndarray  # (K/g, N, 2) float32, or uint16 bfloat16 bits
    group_size: int
    dtype: Literal["fp32", "bf16"]


def to_tinygemm(w: Int4Weight, dtype: Literal["fp32", "bf16"] = "bf16") -> TinygemmWeight:
    """Int4Weight -> tinygemm operands. fp32 is exact up to one rounding of (8 - z) * s; bf16
    rounds scale and zero' to bfloat16 (what the CUDA kernel reads)."""
    if not isinstance(w, Int4Weight):
        raise ValueError(f"w must be an Int4Weight, got {type(w).__name__}")
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    qt = unpack_nibbles(w.packed).T  # (N, K) values 0..15
    weight = np.ascontiguousarray((qt[:, 0::2] << np.uint8(4)) | qt[:, 1::2], dtype=np.uint8)
    s = w.scales_f32.astype(np.float64)
    zero = (8.0 - w.zeros_f32.astype(np.float64)) * s
    sz = np.stack([s, zero], axis=-1).astype(np.float32)  # (K/g, N, 2)
    stored: np.ndarray = f32_to_bf16_bits(sz) if dtype == "bf16" else sz
    return TinygemmWeight(weight, np.ascontiguousarray(stored), w.group_size, dtype)


def tinygemm_unpack(weight: np.ndarray) -> NDArray[np.int32]:
    """tinygemm uint8 (N, K/2) -> int32 (N, K) values 0..15 (input of the CPU convert op)."""
    v.array("weight", weight, np.uint8, 2)
    n, kh = weight.shape
    out = np.empty((n, 2 * kh), np.int32)
    out[:, 0::2] = weight >> np.uint8(4)
    out[:, 1::2] = weight & np.uint8(0x0F)
    return out
