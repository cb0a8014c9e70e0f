"""set_on_signals: a signal sets the event even when it lands while the main thread holds the
event's lock (inside `wait()`), where a handler calling `event.set()` itself hangs for good."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The main thread takes the event's condition lock, as Event.wait() does around its sleep, and the
# signal arrives right then; the handler runs before the `with` block ends.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from anvil_core.signals import set_on_signals

    stop = threading.Event()
    if sys.argv[1] == "naive":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    else:
        set_on_signals(stop)
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes for the pending handler to run between
            pass
    print("set" if stop.wait(10) else "not set", flush=True)
    """
)


def _run(mode: str, timeout_s: float) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=timeout_s
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_signal_inside_wait_sets_the_event() -> None:
    assert _run("relay", 30) == "set"


def test_the_naive_handler_hangs_there() -> None:
    """The failure the relay avoids, shown on the same script (it is why `anvil up` once hung)."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run("naive", 3)
