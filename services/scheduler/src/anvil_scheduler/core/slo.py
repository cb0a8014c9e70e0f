"""SLO attainment per priority over a sliding time window.

Every answered request counts once: met if it finished with a result by its deadline, missed otherwise
(late result, failure, or shed — a shed request did not get its answer). The p99 latency is over the
window's requests answered with a result (the qos service compares it with the SLO: headroom).

The p99 runs on the scheduler's loop once per snapshot (``publish_interval_ms``): sorting a window of
Python tuples there stalled the loop for milliseconds at a few thousand requests a second (a 10 s
window at 4,600 req/s holds 46,000 answers), so the latencies also live in float64 arrays and the
p99 is a ``numpy.partition`` (linear time, in C).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

__all__ = ["SLOTracker"]


class _Latencies:
    """One priority's answers with a result in the window: answer times and latencies, oldest first,
    in two float64 arrays used as a queue (amortised O(1) `push`, the trim and p99 in C)."""

    __slots__ = ("at", "head", "lat", "tail")

    def __init__(self, capacity: int = 1024) -> None:
        self.at = np.empty(capacity)
        self.lat = np.empty(capacity)
        self.head = self.tail = 0

    def push(self, at_s: float, latency_s: float) -> None:
        if self.tail == len(self.at):
            self._make_room()
        self.at[self.tail] = at_s
        self.lat[self.tail] = latency_s
        self.tail += 1

    def _make_room(self) -> None:
        """Move the live part to the front; double the arrays when it fills more than half."""
        n = self.tail - self.head
        cap = len(self.at) * 2 if 2 * n > len(self.at) else len(self.at)
        at, lat = np.empty(cap), np.empty(cap)
        at[:n], lat[:n] = self.at[self.head : self.tail], self.lat[self.head : self.tail]
        self.at, self.lat, self.head, self.tail = at, lat, 0, n

    def trim(self, horizon_s: float) -> None:
        """Drop the answers up to the first one after `horizon_s` (as the events' deque does)."""
        later = self.at[self.head : self.tail] > horizon_s
        self.head = self.tail if not later.any() else self.head + int(np.argmax(later))

    def p99(self) -> float | None:
        n = self.tail - self.head
        if n == 0:
            return None
        rank = max(0, math.ceil(0.99 * n) - 1)  # nearest rank
        return float(np.partition(self.lat[self.head : self.tail], rank)[rank])


class SLOTracker:
    """Owned by one ``SchedulerCore``; single-threaded."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._events: dict[int, deque[tuple[float, bool]]] = {}  # (answered at, met)
        self._met: dict[int, int] = {}
        self._latencies: dict[int, _Latencies] = {}  # the same answers' latencies, those with a result
        self.total_met: dict[int, int] = {}  # since start, per priority
        self.total: dict[int, int] = {}

    def record(self, priority: int, met: bool, now_s: float, latency_s: float | None = None) -> None:
        """One answer; `latency_s` (arrival to answer) only for answers with a result."""
        self._events.setdefault(priority, deque()).append((now_s, met))
        if latency_s is not None and not math.isnan(latency_s):
            lats = self._latencies.get(priority)
            if lats is None:
                lats = self._latencies[priority] = _Latencies()
            lats.push(now_s, latency_s)
        self._met[priority] = self._met.get(priority, 0) + met
        self.total_met[priority] = self.total_met.get(priority, 0) + met
        self.total[priority] = self.total.get(priority, 0) + 1

    def _trim(self, priority: int, now_s: float) -> deque[tuple[float, bool]]:
        events = self._events.get(priority, deque())
        horizon = now_s - self.window_s
        while events and events[0][0] <= horizon:
            _, met = events.popleft()
            self._met[priority] -= met
        return events

    def attainment(self, priority: int, now_s: float) -> float | None:
        """Fraction met among requests answered in the last window; None if none was answered."""
        events = self._trim(priority, now_s)
        return self._met[priority] / len(events) if events else None

    def attainment_all(self, now_s: float) -> dict[int, float | None]:
        return {p: self.attainment(p, now_s) for p in sorted(self._events)}

    def count(self, priority: int, now_s: float) -> int:
        """Requests of ``priority`` answered within the window."""
        return len(self._trim(priority, now_s))

    def p99_s(self, priority: int, now_s: float) -> float | None:
        """p99 latency (nearest rank) of the window's answers with a result; None if there were none."""
        lats = self._latencies.get(priority)
        if lats is None:
            return None
        lats.trim(now_s - self.window_s)
        return lats.p99()
