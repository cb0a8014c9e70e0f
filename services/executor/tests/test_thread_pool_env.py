"""The executor process bounds how long numba's idle OpenMP workers spin (anvil_executor.__main__)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from anvil_executor.__main__ import thread_pool_env
from anvil_executor.settings import ExecutorSettings


def test_spin_count_is_set_unless_the_environment_has_one() -> None:
    env: dict[str, str] = {}
    thread_pool_env(ExecutorSettings(omp_spin_count=123), env)
    assert env == {"GOMP_SPINCOUNT": "123", "KMP_BLOCKTIME": "0"}
    mine = {"GOMP_SPINCOUNT": "999", "KMP_BLOCKTIME": "5"}
    thread_pool_env(ExecutorSettings(), mine)
    assert mine == {"GOMP_SPINCOUNT": "999", "KMP_BLOCKTIME": "5"}


SPIN = """
import os, time, numba, numpy as np
from numba import njit, prange
from anvil_executor.__main__ import thread_pool_env
from anvil_executor.settings import ExecutorSettings
if os.environ.get("APPLY") == "1":
    thread_pool_env(ExecutorSettings(), os.environ)
numba.set_num_threads(2)
@njit(parallel=True)
def f(a):
    for i in prange(a.shape[0]):
        a[i] = a[i] * 1.0001 + 1
a = np.ones(1_000_000, np.float32)
f(a)
burnt = []
for _ in range(9):
    f(a)
    t0 = time.process_time(); time.sleep(0.05); burnt.append(time.process_time() - t0)
print(sorted(burnt)[4])
"""


def _burnt_after_a_region(apply: bool) -> float:
    unset = ("GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["APPLY"] = "1" if apply else "0"
    out = subprocess.run([sys.executable, "-c", SPIN], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_idle_workers_stop_burning_a_core_after_a_region() -> None:
    """CPU time of the process while its main thread sleeps right after a parallel region: the
    workers' spin. With the executor's setting it is a small fraction of OpenMP's default."""
    import numba

    if numba.config.THREADING_LAYER not in ("default", "omp", "safe", "threadsafe"):
        pytest.skip(f"numba's threading layer is {numba.config.THREADING_LAYER}: no OpenMP workers to spin")
    default, bounded = _burnt_after_a_region(False), _burnt_after_a_region(True)
    assert bounded < 0.25 * default or default < 0.0005, (default, bounded)


def test_the_gil_switch_interval_follows_the_setting() -> None:
    import sys

    from anvil_executor.__main__ import gil_switch

    before = sys.getswitchinterval()
    try:
        gil_switch(ExecutorSettings(gil_switch_us=0))
        assert sys.getswitchinterval() == before  # 0: left as Python set it
        gil_switch(ExecutorSettings(gil_switch_us=500))
        assert abs(sys.getswitchinterval() - 0.0005) < 1e-9
    finally:
        sys.setswitchinterval(before)
