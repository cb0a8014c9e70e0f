"""The device arena: one cudaMalloc per bank, a page-locked host bank for staging, and counters that
prove the steady state allocates nothing.

``DeviceArena`` implements the ``Arena`` contract (arena.py) over device memory: ``view`` returns a
CuPy array over the bank (no allocation: a pointer into the bank), ``write`` copies host bytes in,
``ptr`` gives the device address kernels take. ``PinnedBank`` is one page-locked host allocation whose
numpy views requests are unpacked into, so host-to-device copies run asynchronously.

``AllocationCounter`` wraps CuPy's allocator: every CuPy allocation on any device of this process
goes through it. The executor reads ``steady`` (allocations since ``mark_steady``, i.e. after every
model was loaded and warmed) and exports it as a metric; a correct steady state keeps it at 0.

CuPy is imported lazily: importing this module needs no GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from anvil_executor.plan_runtime.arena import ALIGN, BANKS

__all__ = ["AllocationCounter", "DeviceArena", "DeviceMemoryError", "PinnedBank", "counter"]

MiB = 1 << 20


class DeviceMemoryError(MemoryError):
    """A model does not fit the device memory left; the message carries the sizes."""


def _cupy() -> Any:
    import cupy

    return cupy


class AllocationCounter:
    """Counts CuPy allocations (and module loads, which the runtime reports) of this process."""

    def __init__(self) -> None:
        self.total = 0
        self.modules = 0
        self._steady_alloc = 0
        self._steady_mod = 0
        self._installed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        """Route CuPy's allocations through the counter (idempotent)."""
        with self._lock:
            if self._installed:
                return
            cp = _cupy()
            pool = cp.get_default_memory_pool()

            def counting_malloc(size: int) -> Any:
                self.total += 1
                return pool.malloc(size)

            cp.cuda.set_allocator(counting_malloc)
            self._installed = True

    def module_loaded(self) -> None:
        self.modules += 1

    def mark_steady(self) -> None:
        """From now on every allocation or module load is a steady-state one."""
        self._steady_alloc, self._steady_mod = self.total, self.modules

    @property
    def steady_allocations(self) -> int:
        return self.total - self._steady_alloc

    @property
    def steady_module_loads(self) -> int:
        return self.modules - self._steady_mod


counter = AllocationCounter()


def free_bytes(device_id: int) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    cp = _cupy()
    with cp.cuda.Device(device_id):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


class DeviceArena:
    """Banks of device memory, each one cudaMalloc made at construction; never grows."""

    def __init__(self, bank_bytes: dict[str, int], device_id: int, *, what: str = "model") -> None:
        unknown = set(bank_bytes) - set(BANKS)
        if unknown:
            raise ValueError(f"unknown banks {sorted(unknown)}; banks are {BANKS}")
        cp = _cupy()
        self.device_id = device_id
        need = sum(int(v) + ALIGN for v in bank_bytes.values())
        free, total = free_bytes(device_id)
        if need > free:
            sizes = ", ".join(f"{k} {v / MiB:.1f} MiB" for k, v in bank_bytes.items())
            raise DeviceMemoryError(
                f"{what} needs {need / MiB:.1f} MiB on cuda:{device_id} ({sizes}); "
                f"{free / MiB:.1f} MiB of {total / MiB:.1f} MiB are free"
            )
        self._mem: dict[str, Any] = {}
        self._size: dict[str, int] = {}
        with cp.cuda.Device(device_id):
            for name, size in bank_bytes.items():
                self._mem[name] = cp.cuda.memory.Memory(int(size) + ALIGN)  # cudaMalloc: 256-aligned
                self._size[name] = int(size)

    def bank_bytes(self, bank: str) -> int:
        return self._size[bank]

    def ptr(self, bank: str, offset: int = 0) -> int:
        if not 0 <= offset <= self._size[bank]:
            raise ValueError(f"offset {offset} outside bank {bank!r} of {self._size[bank]} bytes")
        return int(self._mem[bank].ptr) + int(offset)

    def view(self, bank: str, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> Any:
        """A C-contiguous CuPy array of ``shape`` at ``offset`` bytes into ``bank``; bounds checked."""
        cp = _cupy()
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + n > self._size[bank]:
            size = self._size[bank]
            raise ValueError(f"view of {n} bytes at {offset} exceeds bank {bank!r} of {size} bytes")
        mp = cp.cuda.MemoryPointer(self._mem[bank], int(offset))
        return cp.ndarray(shape, dtype=dt, memptr=mp)

    def write(self, bank: str, offset: int, data: np.ndarray) -> None:
        """Synchronous host-to-device copy of ``data``'s bytes to ``offset`` (load time only)."""
        cp = _cupy()
        src = np.ascontiguousarray(data)
        if offset < 0 or offset + src.nbytes > self._size[bank]:
            raise ValueError(f"write of {src.nbytes} bytes at {offset} exceeds bank {bank!r}")
        with cp.cuda.Device(self.device_id):
            cp.cuda.runtime.memcpy(self.ptr(bank, offset), src.ctypes.data, src.nbytes, 1)

    def fill(self, bank: str, byte: int) -> None:
        """Every byte of the bank set to ``byte`` (0xFF makes every f32 a NaN: tests catch unwritten
        outputs that way)."""
        cp = _cupy()
        with cp.cuda.Device(self.device_id):
            cp.cuda.runtime.memset(self.ptr(bank), byte, self._size[bank])

    def usage(self) -> dict[str, int]:
        return dict(self._size)


class PinnedBank:
    """One page-locked host allocation, handed out as numpy views at fixed offsets."""

    def __init__(self, nbytes: int) -> None:
        cp = _cupy()
        self.nbytes = max(int(nbytes), ALIGN)
        self._mem = cp.cuda.alloc_pinned_memory(self.nbytes)
        self._buf = np.frombuffer(self._mem, np.uint8, self.nbytes)

    @property
    def base(self) -> int:
        return int(self._buf.ctypes.data)

    def view(self, offset: int, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + n > self.nbytes:
            raise ValueError(f"pinned view of {n} bytes at {offset} exceeds {self.nbytes} bytes")
        return self._buf[offset : offset + n].view(dt).reshape(shape)
