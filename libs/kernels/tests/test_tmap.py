"""The tx tiles' tensor map of x (tmap.py): what it asks of the driver, and how it is passed."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from anvil_kernels.cuda import tmap
from anvil_kernels.cuda.pdl import _ctype_arg


class _FakeEncode:
    """cuTensorMapEncodeTiled's stand-in: decodes its arguments, writes a marker into the map,
    returns ``status``."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.calls: list[dict[str, Any]] = []

    def __call__(self, tm: int, dtype: int, rank: int, addr: int, dims: Any, strides: Any, box: Any,
                 step: Any, interleave: int, swizzle: int, l2: int, oob: int) -> int:  # fmt: skip
        self.calls.append({
            "map": tm, "dtype": dtype, "rank": rank, "addr": addr, "dims": list(dims),
            "strides": list(strides), "box": list(box), "step": list(step),
            "modes": (interleave, swizzle, l2, oob),
        })  # fmt: skip
        ctypes.memmove(tm, (ctypes.c_uint64 * 16)(*range(1, 17)), 128)
        return self.status


def test_encode_x_asks_a_swizzled_2d_map_of_x_in_boxes_of_the_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """x as K values (innermost) by M rows, 2K bytes a row, boxes of 64 x BM, 16-bit elements, the
    128-byte swizzle, rows past M zero; the map at a 64-byte aligned address, its bytes what the
    driver wrote, and the PDL launcher passes those 128 bytes by value."""
    enc = _FakeEncode()
    monkeypatch.setattr(tmap, "_driver", enc)
    xm = tmap.encode_x(0x7F00_0000_1000, 37, 4096, 64)
    (call,) = enc.calls
    assert call["map"] == xm.address and xm.address % 64 == 0
    assert (call["dtype"], call["rank"], call["addr"]) == (1, 2, 0x7F00_0000_1000)  # UINT16, 2-D
    assert call["dims"] == [4096, 37] and call["strides"] == [8192]
    assert call["box"] == [64, 64] and call["step"] == [1, 1]
    assert call["modes"] == (0, 3, 2, 0)  # no interleave, 128-byte swizzle, L2 128 B, zero fill
    words = np.frombuffer(ctypes.string_at(xm.address, 128), np.uint64)
    assert list(words) == list(range(1, 17))
    arg = _ctype_arg(xm)  # what cuLaunchKernelEx is pointed at: the map itself, 128 bytes
    assert ctypes.addressof(arg) == xm.address and ctypes.sizeof(arg) == 128


def test_encode_x_refuses_what_the_copy_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misaligned x, K not whole 64-value chunks, no rows, a box past 256 rows: ValueError before
    the driver is asked; a driver error: RuntimeError with its code."""
    enc = _FakeEncode()
    monkeypatch.setattr(tmap, "_driver", enc)
    bad = ((0x1008, 4, 128, 64), (0x1000, 4, 96, 64), (0x1000, 0, 128, 64), (0x1000, 4, 128, 512))
    for ptr, m, k, rows in bad:
        with pytest.raises(ValueError, match="no tensor map"):
            tmap.encode_x(ptr, m, k, rows)
    assert enc.calls == []
    monkeypatch.setattr(tmap, "_driver", _FakeEncode(status=1))
    with pytest.raises(RuntimeError, match="CUresult 1"):
        tmap.encode_x(0x1000, 4, 128, 64)
