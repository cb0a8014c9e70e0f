"""Programmatic dependent launch (PDL): a kernel launch the GPU may start before the kernel ahead of
it on the stream has finished (sm_90; CUDA 12.3+ keeps it inside captured CUDA graphs).

CuPy launches through ``cuLaunchKernel``, which takes no launch attributes, so a PDL launch goes
through the driver's ``cuLaunchKernelEx`` (ctypes on libcuda, no new dependency) with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``. Only a kernel that executes
``griddepcontrol.wait`` before it touches anything the previous kernel writes may be launched so:
the GEMV-like W4A16 kernels do (w4a16.cu, ``pdl_wait``); nothing else in the project is.

The structures mirror cuda.h (CUDA 12/13): ``CUlaunchAttribute`` is a 4-byte id, 4 bytes of
padding and a 64-byte value union; ``CUlaunchConfig`` is seven unsigned ints, the stream, the
attribute pointer and their count. ``test_cuda_pdl.py`` checks the sizes and offsets against the
header where one is installed.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from anvil_kernels.cuda.tmap import XMap

__all__ = [
    "PROGRAMMATIC_STREAM_SERIALIZATION",
    "LaunchAttribute",
    "LaunchConfig",
    "PdlLauncher",
    "default_launcher",
]

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _AttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("programmatic", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def _ctype_arg(a: Any) -> ctypes._SimpleCData | ctypes.Array:
    """A kernel argument as the C value cuLaunchKernelEx points at: a device array is its pointer,
    numpy int32 / uint64 scalars keep their width; anything else is refused (no silent widening)."""
    if a is None:
        return ctypes.c_void_p(0)
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:
        return ctypes.c_void_p(int(ptr))
    if isinstance(a, np.int32):
        return ctypes.c_int32(int(a))
    if isinstance(a, np.uint64):
        return ctypes.c_uint64(int(a))
    if isinstance(a, XMap):  # a tx kernel's tensor map, by value (its 128 bytes)
        return a.ctype()
    raise TypeError(
        f"a PDL kernel argument must be a device array, np.int32, np.uint64 or an XMap, got {type(a)!r}"
    )


def _function_handle(fn: Any) -> int:
    """The CUfunction of a CuPy kernel: ``Function.ptr``, or a ``RawKernel``'s (what
    ``RawModule.get_function`` returns in CuPy 13+) through its ``kernel`` for the current device."""
    ptr = getattr(fn, "ptr", None)
    if ptr is None:
        ptr = fn.kernel.ptr
    return int(ptr)


@functools.cache
def _load_driver() -> Any:
    """libcuda's cuLaunchKernelEx, looked up once per process (every layer's launcher shares it)."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.restype = ctypes.c_int
    params = ctypes.POINTER(ctypes.c_void_p)
    fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, params, ctypes.c_void_p]
    return fn


class PdlLauncher:
    """Launches a CuPy kernel (``RawModule.get_function``) with programmatic stream serialization
    on the current CuPy stream. ``driver``: cuLaunchKernelEx itself (tests pass a stand-in)."""

    def __init__(self, driver: Any = None) -> None:
        self._launch = driver if driver is not None else _load_driver()
        self._attr = LaunchAttribute()
        self._attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
        self._attr.value.programmatic = 1

    def __call__(
        self, fn: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
    ) -> None:
        import cupy

        g = (*grid, 1, 1)[:3]
        b = (*block, 1, 1)[:3]
        cfg = LaunchConfig(*(int(v) for v in g), *(int(v) for v in b), int(shared_mem))
        cfg.hStream = int(cupy.cuda.get_current_stream().ptr) or None
        cfg.attrs = ctypes.pointer(self._attr)
        cfg.numAttrs = 1
        values = [_ctype_arg(a) for a in args]  # alive until the call returns (the driver copies them)
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        err = int(self._launch(ctypes.pointer(cfg), ctypes.c_void_p(_function_handle(fn)), params, None))
        if err != 0:  # the driver's own error type: the executor's fault handling treats it as any launch's
            raise cupy.cuda.driver.CUDADriverError(err)


@functools.cache
def default_launcher() -> PdlLauncher:
    """The process's launcher on libcuda (made on first use; every W4A16 layer shares it)."""
    return PdlLauncher()
