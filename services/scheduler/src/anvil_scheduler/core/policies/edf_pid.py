"""Anvil's policy: EDF order, shedding of hopeless work, and a PID-controlled target batch size B*.

Release rule (first that holds): the queue holds a full batch of B*; the chosen executor would idle
(work-conserving; while the host's CPUs are busy, only once the head has waited the CPU batching
window, SchedulerConfig.cpu_window_us, unless priority 1 leads); or the earliest deadline's slack —
deadline - start - predicted exec of the batch — is under the guard.

What B* costs is head-of-line blocking: a request that arrives while every executor runs a batch of B*
waits for one to come free before even a batch of one can start. Two mechanisms bound it:

* a **ceiling** (feedforward, from the profile): no batch so long that an arrival of the tightest class
  seen in the window, blocked by it, could not finish alone within ``ceiling_slo_fraction`` of its
  budget. It acts at once, before any measurement, which is what keeps a sudden burst from shedding
  interactive requests while the loop catches up;
* the **PID** (feedback) under that ceiling: it regulates the *best-case latency of each arrival* — the
  first time an executor of its model comes free plus a batch of one, over the request's budget — at
  ``target_slo_fraction``, using the p99 over a sliding window of arrivals. This is measured on every
  arrival, shed or not, and contains no backlog queueing (which a smaller B* would only make worse).
  The latency of *served* requests would not do: shedding censors it, and under overload EDF serves
  everything close to its deadline whatever B* is.

Headroom (error > 0) grows B* for throughput; a tail above target shrinks it. Gains: docs/scheduler.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from anvil_scheduler.core.pid import PIDController, PIDGains
from anvil_scheduler.core.policy import BatchingPolicy, QueueView
from anvil_scheduler.core.request import Request

__all__ = ["EdfPidConfig", "EdfPidPolicy"]


@dataclass(frozen=True)
class EdfPidConfig:
    # Output is B* in requests, error is a fraction of the SLO. See docs/scheduler.md for the derivation.
    gains: PIDGains = field(default_factory=lambda: PIDGains(kp=6.0, ki=12.0, kd=0.0))
    # Setpoint: the p99 arrival could finish alone within 65% of its budget; the rest is room for the
    # batch it actually joins, the EDF wait behind earlier deadlines, and the slack guard.
    target_slo_fraction: float = 0.65
    # Ceiling: the worst-placed arrival of the tightest class could still finish alone within 85% of
    # its budget; the remaining 15% covers the slack guard and execution jitter beyond the p90 profile.
    ceiling_slo_fraction: float = 0.85
    quantile: float = 0.99
    window_ms: float = 500.0  # ~500 arrivals at 1,000 req/s: a p99 that is not a single outlier
    period_ms: float = 50.0  # control period: a few batch cycles; settling takes a few windows
    min_batch: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.target_slo_fraction < 1 or not 0 < self.ceiling_slo_fraction <= 1:
            raise ValueError(f"target/ceiling fractions must be in (0, 1), got {self}")
        if not 0 < self.quantile <= 1 or self.window_ms <= 0 or self.period_ms <= 0 or self.min_batch < 1:
            raise ValueError(f"bad EdfPidConfig: {self}")


@dataclass
class _ModelLoop:
    pid: PIDController
    # (arrival_s, best-case latency / budget, budget_s) of recent arrivals
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)
    last_update_s: float | None = None
    measured: float | None = None  # last windowed quantile, for metrics
    ceiling: int = 1


class EdfPidPolicy(BatchingPolicy):
    name: ClassVar[str] = "edf_pid"

    def __init__(self, config: EdfPidConfig | None = None) -> None:
        super().__init__()
        self.config = config or EdfPidConfig()
        self._loops: dict[str, _ModelLoop] = {}

    def bind(self, model: str, max_batch: int, predict_s: Callable[[int], float]) -> None:
        super().bind(model, max_batch, predict_s)
        low = float(min(self.config.min_batch, max_batch))
        loop = self._loops.get(model)
        if loop is None:
            # Start at the top: an idle system has headroom, and the integrator is not wound up there.
            pid = PIDController(self.config.gains, low, float(max_batch), float(max_batch))
            loop = self._loops[model] = _ModelLoop(pid, ceiling=max_batch)
        loop.ceiling = min(loop.ceiling, max_batch) if loop.samples else max_batch
        loop.pid.set_limits(low, float(max(loop.ceiling, low)))

    def forget(self, model: str) -> None:
        super().forget(model)
        self._loops.pop(model, None)

    def has_loop(self, model: str) -> bool:
        return model in self._loops

    def target(self, model: str) -> float:
        """Continuous controller output (B* before rounding), for metrics and plots."""
        return self._loops[model].pid.output

    def measured(self, model: str) -> float | None:
        """Last windowed p99 of best-case latency / budget that the controller saw."""
        return self._loops[model].measured

    def ceiling(self, model: str) -> int:
        return self._loops[model].ceiling

    def batch_limit(self, model: str) -> int:
        loop = self._loops[model]
        return max(1, min(int(loop.pid.output + 0.5), loop.ceiling, self.max_batch(model)))

    def release_at(self, view: QueueView) -> float:
        if view.executor_idle:
            if view.cpu_window_s <= 0 or view.depth >= view.cap:
                return view.now_s
            # CPU batching window (the host's CPUs are busy): wait for more requests to share this
            # batch's CPU, at most the window after the head arrived and never past its slack.
            due_s = view.head.deadline_s - view.predict_s(view.size) - view.guard_s  # slack at the guard
            return max(view.now_s, min(view.head.arrival_s + view.cpu_window_s, due_s))
        if view.depth < view.cap:
            # Slack trigger: deadline - start - exec(batch) under the guard. The executor is busy until
            # start, so the slack only shrinks when the batch grows; the next arrival polls again.
            slack_s = view.head.deadline_s - view.start_s - view.predict_s(view.size)
            if slack_s >= view.guard_s:
                return math.inf
        # Full, or due: it leaves now, or with late binding at bind_s, when the busy executor is about
        # to free up (bound earlier it would only wait there, formed from the queue as it is now, and a
        # priority-1 request arriving meanwhile would wait behind it).
        return max(view.now_s, view.bind_s)

    def observe_arrival(self, request: Request, best_finish_s: float, now_s: float) -> None:
        loop = self._loops[request.model]
        budget_s = request.control_budget_s
        ratio = (best_finish_s - request.arrival_s) / budget_s
        loop.samples.append((now_s, ratio, budget_s))
        period_s = self.config.period_ms / 1e3
        if loop.last_update_s is None:
            loop.last_update_s = now_s
            return
        if now_s - loop.last_update_s < period_s:
            return
        horizon = now_s - self.config.window_ms / 1e3
        while loop.samples and loop.samples[0][0] < horizon:
            loop.samples.popleft()
        ordered = sorted(v for _, v, _ in loop.samples)
        loop.measured = ordered[min(len(ordered) - 1, math.ceil(self.config.quantile * len(ordered)) - 1)]
        loop.ceiling = self._ceiling(request.model, min(b for _, _, b in loop.samples))
        loop.pid.set_limits(min(loop.pid.low, loop.ceiling), float(loop.ceiling))
        # After an idle gap, integrate one period, not the whole gap.
        dt_s = min(now_s - loop.last_update_s, 2 * period_s)
        loop.last_update_s = now_s
        loop.pid.update(self.config.target_slo_fraction, loop.measured, dt_s)

    def _ceiling(self, model: str, tightest_budget_s: float) -> int:
        """Largest batch that an arrival with ``tightest_budget_s`` can wait behind and still finish
        alone within the ceiling fraction of its budget (at least 1)."""
        allowed_s = self.config.ceiling_slo_fraction * tightest_budget_s - self.predict_s(model, 1)
        lo, hi = 1, self.max_batch(model)
        if self.predict_s(model, hi) <= allowed_s:
            return hi
        while lo < hi:  # largest size within the allowance; predictions grow with size
            mid = (lo + hi + 1) // 2
            if self.predict_s(model, mid) <= allowed_s:
                lo = mid
            else:
                hi = mid - 1
        return lo
