"""A stand-in for CuPy that runs no kernel: device memory is a counter of fake addresses, copies do
nothing, and every kernel launch is checked against the kernel's CUDA signature (parsed from the
module's source): the kernel exists, the argument count matches, each argument has the type its
parameter takes (pointer: a 64-bit address or an array; int: np.int32; long: np.int64; float:
np.float32). ``test_gpu_host_path.py`` runs the GPU runtime's whole host path (load, layout, capture,
per-batch enqueue) under it on a machine without a GPU. Outputs are meaningless; launches are recorded.
"""

from __future__ import annotations

import re
import types
from typing import Any

import numpy as np

KERNEL_RE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')


def signatures(source: str) -> dict[str, list[str]]:
    """kernel name -> parameter kinds ("ptr", "int", "long", "float") of every extern "C" kernel."""
    out: dict[str, list[str]] = {}
    for name, params in KERNEL_RE.findall(source):
        kinds = []
        for p in (x.strip() for x in params.split(",") if x.strip()):
            if "*" in p:
                kinds.append("ptr")
            elif re.search(r"\blong\b", p):
                kinds.append("long")
            elif re.search(r"\bfloat\b", p):
                kinds.append("float")
            elif re.search(r"\bint\b", p):
                kinds.append("int")
            else:
                raise ValueError(f"{name}: parameter {p!r} of unknown kind")
        out[name] = kinds
    return out


class Launches:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []


LAUNCHES = Launches()
_next = [1 << 36]


def _alloc(n: int) -> int:
    ptr = _next[0]
    _next[0] += (int(n) + 4095) // 4096 * 4096 + 4096
    return ptr


class Memory:
    def __init__(self, size: int) -> None:
        self.ptr = _alloc(size)
        self.size = int(size)


class MemoryPointer:
    def __init__(self, mem: Memory, offset: int) -> None:
        self.ptr = mem.ptr + int(offset)


class _Flags:
    c_contiguous = True


class ndarray:  # CuPy's name
    def __init__(self, shape: tuple[int, ...], dtype: Any = np.float32, memptr: Any = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.data = memptr if memptr is not None else MemoryPointer(Memory(self.nbytes), 0)
        self.flags = _Flags()


class Function:
    def __init__(self, name: str, kinds: list[str] | None) -> None:
        self.name, self.kinds = name, kinds
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: Any, block: Any, args: tuple[Any, ...], shared_mem: int = 0) -> None:
        assert all(int(g) >= 1 for g in grid) and all(int(b) >= 1 for b in block), (self.name, grid, block)
        assert int(np.prod(block)) <= 1024, (self.name, block)
        if shared_mem > 48 * 1024:
            assert self.max_dynamic_shared_size_bytes >= shared_mem, (self.name, shared_mem)
        if self.kinds is not None:
            assert len(args) == len(self.kinds), (
                f"{self.name}: {len(args)} args, kernel takes {len(self.kinds)}"
            )
            for i, (a, k) in enumerate(zip(args, self.kinds, strict=True)):
                ok = {
                    "ptr": isinstance(a, (np.uint64, ndarray)),
                    "int": isinstance(a, np.int32),
                    "long": isinstance(a, np.int64),
                    "float": isinstance(a, np.float32),
                }[k]
                assert ok, f"{self.name}: argument {i} is {type(a).__name__}, the kernel takes {k}"
        LAUNCHES.calls.append((self.name, args))


class RawModule:
    """``code``: checked launches; ``path`` or no source: any function, unchecked (a fatbin)."""

    def __init__(self, code: str | None = None, path: str | None = None, options: Any = ()) -> None:
        self.sigs = signatures(code) if code is not None else None

    def get_function(self, name: str) -> Function:
        if self.sigs is None:
            return Function(name, None)
        if name not in self.sigs:
            raise KeyError(f"no kernel {name!r} in the module")
        return Function(name, self.sigs[name])


class Graph:
    def __init__(self, n: int) -> None:
        self.n = n

    def launch(self, stream: Any) -> None:
        return None


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = _alloc(1)
        self._capturing = False

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def begin_capture(self) -> None:
        self._start = len(LAUNCHES.calls)

    def end_capture(self) -> Graph:
        return Graph(len(LAUNCHES.calls) - self._start)

    def synchronize(self) -> None:
        return None


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.block = block
        self.recorded = 0

    def record(self, stream: Any = None) -> None:
        self.recorded += 1

    def synchronize(self) -> None:
        return None


class Device:
    def __init__(self, device_id: int = 0) -> None:
        self.id = device_id
        self.compute_capability = "90"
        self.attributes = {"MultiProcessorCount": 132}

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


class _Pool:
    def malloc(self, size: int) -> MemoryPointer:
        return MemoryPointer(Memory(size), 0)

    def free_all_blocks(self) -> None:
        return None


def _runtime() -> types.SimpleNamespace:
    def nothing(*a: Any, **k: Any) -> None:
        return None

    return types.SimpleNamespace(
        memGetInfo=lambda: (100 << 30, 141 << 30),
        memcpy=nothing,
        memcpyAsync=nothing,
        memset=nothing,
        getDeviceCount=lambda: 1,
        CUDARuntimeError=RuntimeError,
    )


def make_module() -> types.ModuleType:
    """A module object to put in sys.modules["cupy"]."""
    cp = types.ModuleType("cupy")
    cuda = types.SimpleNamespace(
        Device=Device,
        Stream=Stream,
        Event=Event,
        runtime=_runtime(),
        driver=types.SimpleNamespace(CUDADriverError=RuntimeError),
        memory=types.SimpleNamespace(Memory=Memory),
        MemoryPointer=MemoryPointer,
        alloc_pinned_memory=lambda n: bytearray(int(n)),
        set_allocator=lambda f: None,
    )
    pool = _Pool()
    cp.cuda = cuda  # type: ignore[attr-defined]
    cp.RawModule = RawModule  # type: ignore[attr-defined]
    cp.ndarray = ndarray  # type: ignore[attr-defined]
    cp.get_default_memory_pool = lambda: pool  # type: ignore[attr-defined]
    cp.asarray = lambda a: ndarray(np.asarray(a).shape, np.asarray(a).dtype)  # type: ignore[attr-defined]
    cp.asnumpy = lambda a: np.zeros(a.shape, a.dtype)  # type: ignore[attr-defined]
    cp.zeros = lambda n, dtype=np.float32: ndarray((n,) if isinstance(n, int) else n, dtype)  # type: ignore[attr-defined]
    return cp


class FakeCublas:
    """libcublas / libcublasLt: every call succeeds (status 0) and is recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.args: list[tuple[Any, ...]] = []  # each call's arguments, in the order of ``calls``
        self.lt_algorithms = 1  # what cublasLtMatmulAlgoGetHeuristic finds (0: no algorithm)

    def clear(self) -> None:
        self.calls.clear()
        self.args.clear()

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            self.args.append(args)
            if name == "cublasLtMatmulAlgoGetHeuristic":
                args[-1]._obj.value = self.lt_algorithms  # byref(c_int): how many found
            return 0

        return call
