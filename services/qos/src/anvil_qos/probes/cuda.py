"""GPU pressure of executor processes: kernel launch rate and time blocked in CUDA synchronisation.

uprobes on the CUDA driver library (libcuda.so.1), which every CUDA runtime (CuPy, torch, numba)
ends in: `cuLaunchKernel*` calls are counted; `cuStreamSynchronize`, `cuEventSynchronize` and
`cuCtxSynchronize` are timed (the host thread waiting for the GPU). An executor whose wall time is
mostly sync wait is GPU-bound; its launch rate says how busy it keeps the GPU.

Which libcuda: the file an executor has mapped (/proc/<pid>/maps, opened through /proc/<pid>/root so
a container's own copy is the one probed); before any executor has loaded CUDA, the host's (ldconfig
cache, usual paths) or an explicit path. With none anywhere the probe is off and says so once.
"""

from __future__ import annotations

import glob
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from anvil_qos.probes.bpf_loader import BpfUnavailable
from anvil_qos.probes.uprobe_calls import UprobeCalls
from anvil_qos.samples import GpuSample
from anvil_qos.targets import Target

__all__ = ["LAUNCH_SYMBOLS", "NOT_FOUND", "REDISCOVER_S", "SYNC_SYMBOLS", "CudaProbe", "find_libcuda"]

LAUNCH_SYMBOLS = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel")
# `_ptsz` are the per-thread-default-stream entry points that runtimes built with
# --default-stream per-thread call instead.
SYNC_SYMBOLS = (
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuEventSynchronize",
    "cuCtxSynchronize",
)
NOT_FOUND = "libcuda not found, GPU probe off"
REDISCOVER_S = 10.0
_HOST_GLOBS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so*",
    "/usr/lib64/libcuda.so*",
    "/usr/lib/aarch64-linux-gnu/libcuda.so*",
    "/usr/local/cuda/compat/libcuda.so*",
    "/usr/lib/wsl/lib/libcuda.so*",
)


def find_libcuda(pids: Iterable[int] = (), explicit: str = "", proc: Path = Path("/proc")) -> list[str]:
    """Paths (openable from here) of every distinct libcuda to probe; empty when there is none."""
    if explicit:
        return [explicit] if Path(explicit).exists() else []
    found: list[str] = []
    for pid in pids:
        try:
            maps = (proc / str(pid) / "maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            path = fields[5] if len(fields) == 6 else ""
            if "/libcuda.so" in path:
                via_root = f"{proc}/{pid}/root{path}"
                if via_root not in found and Path(via_root).exists():
                    found.append(via_root)
                break
    return found or _host_libcuda()


def _host_libcuda() -> list[str]:
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    for line in cache.splitlines():
        if "libcuda.so.1 " in line and "=>" in line:
            return [line.split("=>")[-1].strip()]
    for pattern in _HOST_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return [hits[-1]]
    return []


class CudaProbe:
    """Owned by the eBPF observer; follows executor targets. `off_reason` is set while nothing is
    attached (no libcuda yet); attach is retried at each `set_targets` as executors load CUDA."""

    def __init__(
        self,
        explicit_library: str = "",
        launch: tuple[str, ...] = LAUNCH_SYMBOLS,
        sync: tuple[str, ...] = SYNC_SYMBOLS,
    ) -> None:
        self._explicit = explicit_library
        self.calls = UprobeCalls(launch, sync)
        self.libraries: list[str] = []
        self.off_reason = NOT_FOUND
        self._targets: dict[int, Target] = {}
        self.discovered_at = 0.0

    def set_targets(self, targets: Iterable[Target]) -> None:
        self._targets = {t.pid: t for t in targets}
        self.calls.set_pids(self._targets)
        self.discover()

    def discover(self) -> None:
        """Attach to any libcuda not attached yet (the observer calls this again every
        REDISCOVER_S: executors map libcuda only once they initialise CUDA)."""
        self.discovered_at = time.monotonic()
        for lib in find_libcuda(self._targets, self._explicit):
            if lib in self.libraries:
                continue
            try:
                self.calls.attach(lib)
            except (BpfUnavailable, OSError) as exc:
                self.off_reason = f"GPU probe off: {exc}"
                continue
            self.libraries.append(lib)
            self.off_reason = ""

    def read(self) -> list[GpuSample]:
        if not self.calls.attached:
            return []
        counts = self.calls.read()
        return [
            GpuSample(t, counts[pid].counted, counts[pid].timed, counts[pid].wait_ns)
            for pid, t in sorted(self._targets.items())
            if pid in counts
        ]

    def close(self) -> None:
        self.calls.close()
