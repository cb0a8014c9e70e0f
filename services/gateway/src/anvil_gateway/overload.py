"""The gateway's own queue, measured: how long a callback made ready now waits in the event loop.

Every HTTP request is read and parsed by the event loop in arrival order, whatever its priority: when
the gateway is short of CPU (a burst 13x the mean rate on two cores), a priority-1 request waits behind
the parsing of every lower-priority one that came before it (issue #19 measured ~100 ms there). The
gateway cannot parse a body to learn its priority without spending the CPU it lacks, but it can stop
spending more on lower priorities: past the parse, a request of a priority whose delay threshold the
loop's delay exceeds is answered 429 (shed) at once, before it costs the scheduler, the executor and the
response encoding anything, so the loop drains and priority 1 gets through. Only while a more important
request came within the last second (Admission): otherwise the shed request frees CPU for nobody.

The delay is sampled by the requests themselves (no timer: an idle gateway is never woken): an
admission arms one ``call_soon`` probe when none is pending; the probe's wait is the delay. A probe
still pending counts with its age, so a stalled loop reads as stalled before the probe runs; it takes
two late readings in a row, so one stall of the process is not an overload.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["LoopDelay"]


class LoopDelay:
    """Event-loop delay in s: the smaller of the two latest readings within ``hold_s`` (a pending
    probe's age counts as a reading), so one stall of the process (a GC pause, a shared core's run
    queue) reads as nothing and only a loop that stays late does."""

    def __init__(self, hold_s: float = 0.1) -> None:
        self.hold_s = hold_s  # a probe's reading stands this long (probes run once per loop turn)
        self._armed_at: float | None = None
        self._armed_on: asyncio.AbstractEventLoop | None = None  # the loop probed last
        self._readings: deque[tuple[float, float]] = deque(maxlen=2)  # (taken at s, delay s)

    def sample(self, now_s: float) -> None:
        """Arm a probe if none is pending (needs a running loop; outside one this does nothing)."""
        if self._armed_at is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._armed_at, self._armed_on = now_s, loop
        loop.call_soon(self._ran)

    def _ran(self) -> None:
        now = time.monotonic()
        if self._armed_at is not None:
            self._readings.append((now, now - self._armed_at))
        self._armed_at = None  # (_armed_on stays: the readings belong to that loop)

    def delay_s(self, now_s: float) -> float:
        if self._armed_on is not None and self._armed_on is not _running_loop():
            # probed on a loop that has ended (tests, a restarted app): its readings say nothing now
            self._armed_at = self._armed_on = None
            self._readings.clear()
        values = [v for at, v in self._readings if now_s - at <= self.hold_s]
        pending = now_s - self._armed_at if self._armed_at is not None else 0.0
        if pending > 0 and (not values or pending >= values[-1]):
            values.append(pending)  # a probe late already; a fresh one says nothing yet
        return min(values[-2:]) if len(values) >= 2 else 0.0


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
