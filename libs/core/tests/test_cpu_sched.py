"""``apply_cpu_sched`` (anvil_core.runtime): setting ``cpu_sched`` reaches every thread of the process,
threads started afterwards inherit it, "other" puts the kernel's default back and the default,
"inherit", changes nothing. Runs in a child process so the test runner's own threads keep their
policy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from anvil_core.runtime import apply_cpu_sched
    from anvil_core.settings import ServiceSettings

    started = threading.Event()
    release = threading.Event()
    early = {}

    def before():
        early["tid"] = threading.get_native_id()
        started.set()
        release.wait()

    t = threading.Thread(target=before)
    t.start()
    started.wait()
    assert apply_cpu_sched(ServiceSettings(cpu_sched="batch")) == "SCHED_BATCH"
    later = {}
    t2 = threading.Thread(target=lambda: later.setdefault("policy", os.sched_getscheduler(0)))
    t2.start(); t2.join()
    got = [os.sched_getscheduler(0), os.sched_getscheduler(early["tid"]), later["policy"]]
    assert got == [os.SCHED_BATCH] * 3, got
    assert apply_cpu_sched(ServiceSettings(cpu_sched="other")) == "SCHED_OTHER"
    assert os.sched_getscheduler(early["tid"]) == os.SCHED_OTHER
    apply_cpu_sched(ServiceSettings(cpu_sched="batch"))
    assert apply_cpu_sched(ServiceSettings()) == "inherited"  # the default leaves the policy alone
    assert os.sched_getscheduler(early["tid"]) == os.SCHED_BATCH
    release.set(); t.join()
    print("ok")
    """
)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_every_thread_gets_the_policy_and_new_threads_inherit_it() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_setting_takes_only_known_policies() -> None:
    from pydantic import ValidationError

    from anvil_core.settings import ServiceSettings

    with pytest.raises(ValidationError):
        ServiceSettings(cpu_sched="fifo")  # type: ignore[arg-type]
