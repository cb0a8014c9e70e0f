"""SLO attainment per priority over a sliding time window.

Every answered request counts once: met if it finished with a result by its deadline, missed otherwise
(late result, failure, or shed — a shed request did not get its answer). The p99 latency is over the
window's requests answered with a result (the qos service compares it with the SLO: headroom).
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["SLOTracker"]


class SLOTracker:
    """Owned by one ``SchedulerCore``; single-threaded."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        # (answered at, met, latency s or NaN when answered without a result)
        self._events: dict[int, deque[tuple[float, bool, float]]] = {}
        self._met: dict[int, int] = {}
        self.total_met: dict[int, int] = {}  # since start, per priority
        self.total: dict[int, int] = {}

    def record(self, priority: int, met: bool, now_s: float, latency_s: float | None = None) -> None:
        """One answer; `latency_s` (arrival to answer) only for answers with a result."""
        latency = math.nan if latency_s is None else latency_s
        self._events.setdefault(priority, deque()).append((now_s, met, latency))
        self._met[priority] = self._met.get(priority, 0) + met
        self.total_met[priority] = self.total_met.get(priority, 0) + met
        self.total[priority] = self.total.get(priority, 0) + 1

    def _trim(self, priority: int, now_s: float) -> deque[tuple[float, bool, float]]:
        events = self._events.get(priority, deque())
        horizon = now_s - self.window_s
        while events and events[0][0] <= horizon:
            _, met, _ = events.popleft()
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
        latencies = sorted(lat for _, _, lat in self._trim(priority, now_s) if not math.isnan(lat))
        if not latencies:
            return None
        return latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)]
