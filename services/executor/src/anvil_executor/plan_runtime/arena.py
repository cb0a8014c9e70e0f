"""A bank-partitioned arena over host memory.

One allocation per bank, made at model load: ``weights`` (filled once, then read-only),
``activations`` (every plan tensor at the static offset the compiler planned), and ``staging``
(optional, for inputs that arrive from the network). Nothing is allocated per batch.

The API is the contract a device arena implements too (``anvil_kernels.cuda``'s arena can offer the
same four methods over one cudaMalloc): ``bank_bytes`` to size, ``view`` to address a tensor by
(bank, offset, shape, dtype), ``write`` to copy bytes in, ``usage`` for metrics.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["BANKS", "Arena", "HostArena"]

BANKS = ("weights", "activations", "staging")
ALIGN = 256  # bytes; matches the compiler's memory plan and the CUDA arena


class Arena(Protocol):
    """The contract of a bank-partitioned arena; ``HostArena`` (numpy) and ``cuda_arena.DeviceArena``
    (one cudaMalloc per bank) implement it. The model that made the arena owns it and every view it
    hands out; views stay valid while the arena lives, and nothing is allocated after construction."""

    def bank_bytes(self, bank: str) -> int:
        """Size of ``bank`` in bytes (fixed at construction)."""
        ...

    def view(self, bank: str, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> Any:
        """An array (numpy or CuPy) of ``shape`` at ``offset`` into ``bank``; ValueError past its end."""
        ...

    def write(self, bank: str, offset: int, data: np.ndarray) -> None:
        """Copy host ``data``'s bytes to ``offset`` (load time)."""
        ...

    def usage(self) -> dict[str, int]:
        """Bytes per bank, for metrics."""
        ...


class HostArena:
    """Owns its banks; views it hands out are valid while the arena lives."""

    def __init__(self, bank_bytes: dict[str, int]) -> None:
        unknown = set(bank_bytes) - set(BANKS)
        if unknown:
            raise ValueError(f"unknown banks {sorted(unknown)}; banks are {BANKS}")
        self._banks: dict[str, np.ndarray] = {}
        for name, size in bank_bytes.items():
            raw = np.zeros(int(size) + ALIGN, dtype=np.uint8)
            start = (-raw.ctypes.data) % ALIGN  # base of every bank is 256-aligned
            self._banks[name] = raw[start : start + int(size)]

    def bank_bytes(self, bank: str) -> int:
        return int(self._banks[bank].size)

    def view(self, bank: str, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """A C-contiguous array of ``shape`` at ``offset`` bytes into ``bank``; bounds checked."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = self._banks[bank]
        if offset < 0 or offset + n > buf.size:
            raise ValueError(f"view of {n} bytes at {offset} exceeds bank {bank!r} of {buf.size} bytes")
        return buf[offset : offset + n].view(dt).reshape(shape)

    def write(self, bank: str, offset: int, data: np.ndarray) -> None:
        src = np.ascontiguousarray(data)
        self.view(bank, offset, (src.nbytes,), np.uint8)[:] = src.reshape(-1).view(np.uint8)

    def usage(self) -> dict[str, int]:
        """Bytes per bank (all of it is reserved up front: the arena never grows)."""
        return {name: int(b.size) for name, b in self._banks.items()}
