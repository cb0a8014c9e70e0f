"""TMA tensor maps of x for the tx tiles (``MtcConfig.tx``, w4a16_wgs.cu ``AnvilTmap``).

A tx kernel's producer copies each chunk's x tile straight from x (M rows x K values, 16-bit,
row-major) with one ``cp.async.bulk.tensor.2d`` a stage, instead of the launcher first retiling x
with ``w4a16_tile_x``. The map is the driver's ``CUtensorMap`` (128 opaque bytes), encoded here by
``cuTensorMapEncodeTiled`` through ctypes on libcuda (no new dependency) for one x pointer and M,
and passed to the kernel by value (a ``__grid_constant__`` parameter): boxes of 64 k x BM rows,
128-byte swizzle (the layout the kernel's wgmma descriptor reads), rows past M zero-filled by the
copy itself.
"""

from __future__ import annotations

import ctypes
from typing import Any

MAP_BYTES = 128
MAP_ALIGN = 64  # cuTensorMapEncodeTiled's requirement on the map's address
BOX_K = 64  # values a box row holds: 128 bytes, the 128-byte swizzle's span
# CUtensorMapDataType, ..Interleave, ..Swizzle, ..L2promotion, ..FloatOOBfill (cuda.h)
_UINT16, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_128B, _OOB_ZERO = 1, 0, 3, 2, 0

_driver: Any = None


def _encoder() -> Any:
    global _driver
    if _driver is None:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        enum = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, enum, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       enum, enum, enum, enum]  # fmt: skip
        _driver = fn
    return _driver


class XMap:
    """One encoded map of x: 128 bytes at a 64-byte aligned host address (its own buffer)."""

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
        base = ctypes.addressof(self._buf)
        self.address = base + (-base % MAP_ALIGN)
        self._param: Any = None

    def param(self) -> Any:
        """The kernel argument CuPy passes by value: a pointer to the map's bytes (its size is the
        kernel's parameter's, 128); made once."""
        if self._param is None:
            from cupy.cuda.function import CPointer

            self._param = CPointer(self.address)
        return self._param

    def ctype(self) -> ctypes.Array:
        """The same for cuLaunchKernelEx (pdl.py): the 128 bytes as a ctypes object at the map."""
        return (ctypes.c_char * MAP_BYTES).from_address(self.address)


def encode_x(ptr: int, m: int, k: int, box_rows: int) -> XMap:
    """The map of x at device address ``ptr`` (m rows of k 16-bit values, row-major) in boxes of
    64 values x ``box_rows`` rows (the tile's BM). Raises ValueError on an x the copy cannot read
    (misaligned, K not whole chunks) and RuntimeError with the driver's code if it refuses."""
    if ptr % 16 or k % BOX_K or not 1 <= m < 2**31 or not 1 <= box_rows <= 256:
        raise ValueError(f"no tensor map for x at {ptr:#x}, M={m}, K={k}, box rows {box_rows}")
    xm = XMap()
    dims = (ctypes.c_uint64 * 2)(k, m)
    strides = (ctypes.c_uint64 * 1)(2 * k)  # bytes between rows (the innermost stride is the value's)
    box = (ctypes.c_uint32 * 2)(BOX_K, box_rows)
    step = (ctypes.c_uint32 * 2)(1, 1)
    rc = int(_encoder()(xm.address, _UINT16, 2, ptr, dims, strides, box, step,
                        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_128B, _OOB_ZERO))  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for x at {ptr:#x}, M={m}, K={k}")
    return xm
