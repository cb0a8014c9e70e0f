"""The part of a request's budget the scheduler cannot plan with (issue #19), kept back from the
deadline the gateway sends it.

The scheduler plans a request to finish by its deadline less a guard (2 ms + 10% of the horizon),
counting its own queue, the executor's queue and execution, and its learned round trip to the
executor. It does not see the gateway's own time before sending (``gateway_in``), the link to it
(``to_scheduler``), the answer's way back to the gateway (``back``) or the response's building
(``gateway_out``). Under a burst on a busy host those reach tens of ms at p99, so priority 1 was
planned to finish "in time" and answered late (docs/scheduler.md, "On a device-bound model").

With ``quantile`` q > 0, the gateway keeps, per priority, the last ``window`` answers' sum of those
four hops and sends the scheduler ``deadline - reserve``, the reserve being their q-quantile
(recomputed every ``every`` answers), at most ``max_fraction`` of the budget. The client's own wait
(the gateway's 504) keeps the whole budget. q = 0: off, the deadline is the budget's end.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["DeadlineReserve"]


class DeadlineReserve:
    def __init__(
        self, quantile: float = 0.0, window: int = 256, every: int = 16, max_fraction: float = 0.5
    ) -> None:
        if not 0.0 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        self.quantile = quantile
        self.window = window
        self.every = every
        self.max_fraction = max_fraction
        self._samples: dict[int, deque[int]] = {}
        self._pending: dict[int, int] = {}  # answers since the reserve was recomputed
        self._reserve_s: dict[int, float] = {}

    def observe(self, priority: int, unseen_us: int) -> None:
        """One answered request's time outside the scheduler's plan (µs)."""
        if self.quantile <= 0.0:
            return
        samples = self._samples.get(priority)
        if samples is None:
            samples = self._samples[priority] = deque(maxlen=self.window)
        samples.append(max(0, unseen_us))
        n = self._pending.get(priority, 0) + 1
        if n >= self.every or len(samples) <= self.every:  # and at each answer while warming up
            ordered = sorted(samples)
            self._reserve_s[priority] = ordered[math.ceil(self.quantile * len(ordered)) - 1] / 1e6
            n = 0
        self._pending[priority] = n

    def reserve_s(self, priority: int, budget_s: float) -> float:
        """Seconds to keep back from a request of ``priority`` with ``budget_s`` (0 when off)."""
        return min(self._reserve_s.get(priority, 0.0), self.max_fraction * budget_s)
