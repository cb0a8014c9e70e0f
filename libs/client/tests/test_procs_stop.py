"""stop_groups: many process groups stopped within one grace, not one grace each."""

from __future__ import annotations

import subprocess
import sys
import time

from anvil_client.procs import running, stop_groups

# Ignores SIGTERM (a service inside a long C call handles it only when the call returns).
_STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)
_POLITE = "import time; print('up', flush=True); time.sleep(60)"


def _start(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # its handler is set
    return proc


def test_stubborn_groups_share_one_grace_and_polite_ones_stop_at_once() -> None:
    stubborn = [_start(_STUBBORN) for _ in range(3)]
    polite = [_start(_POLITE) for _ in range(2)]
    grace_s = 1.0
    t0 = time.monotonic()
    stop_groups([p.pid for p in stubborn + polite], grace_s=grace_s)
    took = time.monotonic() - t0
    for p in stubborn:
        assert p.wait(5) == -9  # killed after the grace
    for p in polite:  # ended by the SIGTERM, and reaped by stop_groups (its children)
        p.wait(5)
        assert not running(p.pid)
    # one grace for all three stubborn groups (sequential stops took one each: 3 x grace_s)
    assert grace_s <= took < 2 * grace_s


def test_polite_groups_alone_take_no_grace() -> None:
    polite = [_start(_POLITE) for _ in range(3)]
    t0 = time.monotonic()
    stop_groups([p.pid for p in polite], grace_s=5.0)
    assert time.monotonic() - t0 < 5.0  # gone at the SIGTERM, not killed after the grace
    for p in polite:
        p.wait(5)
        assert not running(p.pid)


def test_gone_pids_are_skipped() -> None:
    proc = _start(_POLITE)
    proc.kill()
    proc.wait(5)
    stop_groups([proc.pid], grace_s=5.0)  # no such group: returns at once, raises nothing
