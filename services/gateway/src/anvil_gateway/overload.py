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
still pending counts with its age, so a stalled loop reads as stalled before the probe runs.
"""

from __future__ import annotations

import asyncio
import math
import time

__all__ = ["LoopDelay"]


class LoopDelay:
    """Event-loop delay in s, as of the latest probe (held for ``hold_s``) or a pending probe's age."""

    def __init__(self, hold_s: float = 0.1) -> None:
        self.hold_s = hold_s  # a probe's reading stands this long (probes run once per loop turn)
        self._armed_at: float | None = None
        self._armed_on: asyncio.AbstractEventLoop | None = None  # the loop probed last
        self._last_s = 0.0
        self._last_at = -math.inf

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
            self._last_s, self._last_at = now - self._armed_at, now
        self._armed_at = None  # (_armed_on stays: the readings belong to that loop)

    def delay_s(self, now_s: float) -> float:
        if self._armed_on is not None and self._armed_on is not _running_loop():
            # probed on a loop that has ended (tests, a restarted app): its readings say nothing now
            self._armed_at = self._armed_on = None
            self._last_s, self._last_at = 0.0, -math.inf
        pending = now_s - self._armed_at if self._armed_at is not None else 0.0
        recent = self._last_s if now_s - self._last_at <= self.hold_s else 0.0
        return max(pending, recent)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
