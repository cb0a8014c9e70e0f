"""Helper processes for the qos tests: a sleeper that wakes every 0.5 ms, a CPU hog, a caller of libc
functions, all optionally pinned to one core; and the eBPF gate (skip with the reason where eBPF is
impossible here: not root, no tracefs, no bcc, no headers — run .ci/prepare_ebpf.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from anvil_qos.probes.bpf_loader import unavailable_reason

SLEEPER = """
import os, sys, time
if len(sys.argv) > 1 and sys.argv[1] != "-":
    os.sched_setaffinity(0, {int(sys.argv[1])})
while True:
    time.sleep(0.0005)
    sum(range(3000))  # ~40 µs of work: enough that a hog on its core makes it queue
"""

# At nice -10 (where allowed) the hog outweighs the sleeper ~9:1 (-19: ~68:1), so the delay it adds
# stands out of whatever else shares the machine.
HOG = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.nice(int(sys.argv[2]))
except PermissionError:
    pass
while True:
    pass
"""

# Waits for a line on stdin, calls getpid() N times and sleeps M x 5 ms, says "done", waits again.
CALLER = """
import os, sys, time
n, m = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    os.getpid()
for _ in range(m):
    time.sleep(0.005)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="session")
def ebpf() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"eBPF impossible here: {reason}")


@pytest.fixture
def cpu() -> int:
    """The core the sleeper and the hog share: the last one this process may run on."""
    return max(os.sched_getaffinity(0))


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """spawn(code, *args, stdin=False, stdout=False) -> a python process, killed at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def _spawn(code: str, *args: str, stdin: bool = False, stdout: bool = False) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            text=True,
        )
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def sleeper(spawn: Spawn) -> Callable[..., subprocess.Popen[str]]:
    """sleeper(cpu | None, name="-") -> a process waking every 0.5 ms; `name` lands in its argv (the
    qos target resolver matches "anvil_<kind>" there)."""

    def _sleeper(cpu: int | None = None, name: str = "") -> subprocess.Popen[str]:
        args = [str(cpu) if cpu is not None else "-"] + ([name] if name else [])
        return spawn(SLEEPER, *args)

    return _sleeper


@pytest.fixture
def hog(spawn: Spawn) -> Callable[..., subprocess.Popen[str]]:
    """hog(cpu, nice=-10) -> a busy loop pinned to `cpu` (kill it to stop the pressure)."""
    return lambda cpu, nice=-10: spawn(HOG, str(cpu), str(nice))


@pytest.fixture
def caller(spawn: Spawn) -> Callable[[int, int], subprocess.Popen[str]]:
    """caller(n, m) -> a process that, once sent a line, calls getpid() n times and sleeps m x 5 ms."""

    def _caller(n: int, m: int) -> subprocess.Popen[str]:
        proc = spawn(CALLER, str(n), str(m), stdin=True, stdout=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    return _caller
