"""Turning SIGTERM / SIGINT into a `threading.Event` without the deadlock of the obvious way.

`signal.signal(SIGTERM, lambda *_: stop.set())` can hang a process for good: Python runs the
handler in the main thread between two bytecodes, and when that thread is inside `stop.wait()`
(holding the event's internal lock for a few bytecodes before it sleeps, and again after it wakes)
`stop.set()` waits on a lock its own thread holds. A loop that waits 0.2 s at a time passes that
window five times a second; on a slow machine Ctrl-C then hung `anvil up` until it was killed.

Here the handler only writes a byte to a pipe (no lock), and a daemon thread reads it and sets the
event from outside the main thread.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType

__all__ = ["set_on_signals"]


def set_on_signals(
    event: threading.Event, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> None:
    """From now on each of `signals` sets `event` (call from the main thread, as `signal.signal`)."""
    read_fd, write_fd = os.pipe()  # close-on-exec: children do not inherit them
    os.set_blocking(write_fd, False)

    def handler(_signum: int, _frame: FrameType | None) -> None:
        try:
            os.write(write_fd, b"\0")
        except BlockingIOError:  # a full pipe already holds a wake-up
            pass

    def relay() -> None:
        os.read(read_fd, 1)
        event.set()

    threading.Thread(target=relay, name="signal-relay", daemon=True).start()
    for sig in signals:
        signal.signal(sig, handler)
