"""Which device an executor runs on: ``ANVIL_DEVICE`` parsed and checked at start-up.

``cpu`` runs compiled plans on the CPU backend (numba). ``cuda`` or ``cuda:N`` runs them on CUDA
device N through CuPy; the executor refuses to start when CuPy or that device is missing (it never
falls back to the CPU while claiming a GPU). On a CUDA device the built-ins identity, mlp and
mlp4x1024 run there too unless ANVIL_GPU_BUILTINS=host (models/gpu_builtins.py); busy always sleeps
on the host. The registry shows each model's platform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DeviceError", "DeviceSpec", "is_device_fault", "open_device", "parse_device"]

_CUDA = re.compile(r"^cuda(?::(\d{1,3}))?$")


class DeviceError(RuntimeError):
    """The configured device cannot be used; the message says why and what to check."""


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    kind: str  # "cpu" | "cuda"
    index: int = 0

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.is_cuda else "cpu"


def parse_device(value: str) -> DeviceSpec:
    """``cpu``, ``cuda`` or ``cuda:N`` (N a device ordinal); anything else is a ValueError."""
    v = value.strip().lower()
    if v == "cpu":
        return DeviceSpec("cpu")
    m = _CUDA.match(v)
    if m is None:
        raise ValueError(f"ANVIL_DEVICE must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")
    return DeviceSpec("cuda", int(m.group(1) or 0))


def open_device(spec: DeviceSpec) -> str:
    """Check the device can be used; returns a one-line description (name, memory, arch)."""
    if not spec.is_cuda:
        return "cpu"
    try:
        import cupy as cp
    except ImportError as exc:
        raise DeviceError(
            f"ANVIL_DEVICE={spec} needs CuPy (pip install cupy-cuda12x or cupy-cuda13x); run `anvil doctor`"
        ) from exc
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver: CUDARuntimeError
        msg = f"ANVIL_DEVICE={spec}: no CUDA driver or device ({exc}); run `anvil doctor`"
        raise DeviceError(msg) from exc
    if spec.index >= count:
        raise DeviceError(f"ANVIL_DEVICE={spec}: this host has {count} CUDA device(s)")
    with cp.cuda.Device(spec.index) as dev:
        props = cp.cuda.runtime.getDeviceProperties(spec.index)
        free, total = cp.cuda.runtime.memGetInfo()
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"{name} sm_{dev.compute_capability}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error that leaves the context unusable (illegal address, launch failure, ...): the
    executor answers the batch with an error and exits so the launcher restarts it clean."""
    return type(exc).__name__ in {"CUDARuntimeError", "CUDADriverError"}
