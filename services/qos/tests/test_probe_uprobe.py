"""The uprobe machinery of the GPU probe, proven on libc: a helper calls getpid() N times (counted,
like cuLaunchKernel) and sleeps M times (timed, like cuStreamSynchronize); the probe must count
exactly those calls of that process, and the time spent inside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from anvil_qos.probes.cuda import NOT_FOUND, find_libcuda
from anvil_qos.targets import Target


def _libc_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/libc.so" in path or "/libc-" in path:
            return f"/proc/{pid}/root{path}"
    raise AssertionError(f"no libc mapped in {pid}")


@pytest.fixture
def cleanup() -> Iterator[list[object]]:
    probes: list[object] = []
    yield probes
    for p in probes:
        p.close()  # type: ignore[attr-defined]


def test_uprobe_counts_library_calls_of_a_target_exactly(ebpf: None, caller, cleanup) -> None:
    from anvil_qos.probes.cuda import CudaProbe

    n, m = 5000, 20
    helper, bystander = caller(n, m), caller(n, m)
    # The same machinery as the GPU probe, pointed at libc instead of libcuda.
    probe = CudaProbe(_libc_of(helper.pid), launch=("getpid",), sync=("clock_nanosleep",))
    cleanup.append(probe)
    probe.set_targets([Target("executor", "helper", helper.pid)])
    assert probe.off_reason == "" and probe.libraries

    for proc in (helper, bystander):  # the bystander calls the same functions, untargeted
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in (helper, bystander):
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"

    (gpu,) = probe.read()
    assert gpu.target.pid == helper.pid
    assert gpu.launches == n
    assert gpu.syncs == m
    # Each sleep is 5 ms; the wait includes the scheduler's wake-up latency, never less.
    assert m * 5e6 <= gpu.sync_wait_ns < m * 5e6 * 3, gpu.sync_wait_ns


def test_gpu_probe_says_it_is_off_without_libcuda(ebpf: None, cleanup) -> None:
    from anvil_qos.probes.cuda import CudaProbe

    if find_libcuda():
        pytest.skip("this machine has a libcuda; the off path is not reachable")
    probe = CudaProbe()
    cleanup.append(probe)
    probe.set_targets([])
    assert probe.off_reason == NOT_FOUND == "libcuda not found, GPU probe off"
    assert probe.read() == []
