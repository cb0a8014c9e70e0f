"""Scheduler configuration: priority classes and the knobs of the shared machinery.

Declared once, frozen, units in every field name. Policy-specific knobs (PID gains, fixed delay,
AIMD steps) live next to their policy in ``policies/``; the latency prior lives in ``profile.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anvil_core.priorities import DEFAULT_SLO_MS, PRIORITIES, PRIORITY_NAMES

__all__ = ["DEFAULT_PRIORITIES", "PriorityClass", "SchedulerConfig"]


@dataclass(frozen=True)
class PriorityClass:
    """One priority class. Lower number = more important (1 is served and protected first)."""

    priority: int
    name: str
    slo_ms: float  # end-to-end budget inside Anvil: deadline = arrival + slo_ms (a timeout may tighten it)

    def __post_init__(self) -> None:
        if self.priority < 1:
            raise ValueError(f"priority must be >= 1 (1 is the most important), got {self.priority}")
        if self.slo_ms <= 0:
            raise ValueError(f"slo_ms of priority {self.priority} must be > 0, got {self.slo_ms}")


# The classes with their default SLOs (anvil_core.priorities says why each number); the service
# builds its own from the settings (ANVIL_SLO_P*_MS).
DEFAULT_PRIORITIES: tuple[PriorityClass, ...] = tuple(
    PriorityClass(p, PRIORITY_NAMES[p], float(DEFAULT_SLO_MS[p])) for p in PRIORITIES
)


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of ``SchedulerCore`` (queues, shedding, dispatch, bookkeeping)."""

    priorities: tuple[PriorityClass, ...] = DEFAULT_PRIORITIES
    # Hard bound on queued requests per model (memory and worst-case scan cost, not the main overload
    # signal: the work-ahead test in admission sheds long before a sane bound is reached). Beyond it a
    # higher-priority arrival evicts the lowest-priority, latest-deadline request.
    max_queue_depth: int = 4096
    # Margin kept between a predicted finish and a deadline: guard = slack_guard_us + fraction x (predicted
    # finish - now). A batch is released when the earliest deadline's slack falls under it, never formed
    # so large that the earliest deadline is inside it, and admission demands it. 2 ms covers the dispatch
    # hop (ZeroMQ p99 ~0.2 ms) and the result hop back; 10% of the horizon covers execution jitter beyond
    # the profile's p90 (a GPU's ~5% lognormal jitter has its p99.9 ~9% above its p90).
    slack_guard_us: int = 2000
    slack_guard_fraction: float = 0.10
    # An executor counts as idle (work-conserving trigger) when its predicted in-flight work ends within
    # this lead: the batch travels while the previous one finishes, so the device never waits on the wire.
    dispatch_lead_us: int = 300
    # Credits an executor grants beyond its own to an urgent batch (one carrying top-priority work), so
    # that priority 1 never waits in the scheduler for a credit that lower-priority batches hold; the
    # executor runs urgent batches first, so such a batch waits at most for the one running (#19). One is
    # enough: urgent batches are rare (10% of requests) and two urgent batches queue in EDF order anyway.
    reserved_credits: int = 1
    # Late binding (EDF+PID): a full or due batch led by lower-priority work leaves for a busy executor
    # only when that executor is about to free up (its predicted start less the lead or the learned
    # round trip), so it is formed from the queue as it is then; a batch led by priority 1 still leaves
    # at once (and may take the reserved credit). Off: every batch leaves on the first free credit.
    # Measured on the live stack (docs/scheduler.md, "Late binding"): more goodput under overload, a
    # little less priority-1 attainment; in the simulator it gives back what credits > 1 cost.
    late_binding: bool = False
    # CPU batching window (EDF+PID): while the host's CPUs are busy (the service reads /proc/stat:
    # host_cpu.py), a batch led by lower-priority work no longer leaves the moment an executor is idle:
    # it waits, at most this long after its head arrived and never past the head's slack, for more
    # requests to share the batch's CPU (each batch costs the gateway, scheduler and executor their
    # per-batch work; on shared cores that CPU is what the next request waits for). The window opens
    # linearly from 0 at `cpu_busy_low` to the whole of it at `cpu_busy_high` (busy fraction, 0..1); a
    # batch led by priority 1 always leaves at once. 0 (the default) turns it off. docs/scheduler.md,
    # "CPU batching window".
    cpu_window_us: int = 0
    cpu_busy_low: float = 0.75
    cpu_busy_high: float = 0.95
    # Attempts per request before an executor failure is final (1 original + 1 re-dispatch).
    max_attempts: int = 2
    # How long answered request ids are remembered to suppress duplicates and late results. Must exceed
    # the longest SLO plus the gateway's retry window; 60 s is 30x the batch-class SLO.
    dedup_window_s: float = 60.0
    # Sliding window of the per-priority SLO attainment metric.
    slo_window_s: float = 10.0
    # A request the profile calls hopeless still runs, alone on an idle executor, once per this interval
    # per (model, priority): the probe that lets a wrong prediction recover (issue #22). 0.5 s costs an
    # idle executor one batch of one per class every half second, and a client at most one late answer.
    probe_interval_s: float = 0.5
    # Batch sizes kept per model for the batch-size history metric.
    batch_history_len: int = 4096
    priority_by_number: dict[int, PriorityClass] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.priorities:
            raise ValueError("at least one priority class is required")
        by_number = {p.priority: p for p in self.priorities}
        if len(by_number) != len(self.priorities):
            raise ValueError(f"priority numbers must be unique, got {[p.priority for p in self.priorities]}")
        if self.max_queue_depth < 1:
            raise ValueError(f"max_queue_depth must be >= 1, got {self.max_queue_depth}")
        if self.reserved_credits < 0:
            raise ValueError(f"reserved_credits must be >= 0, got {self.reserved_credits}")
        if self.slack_guard_us < 0 or self.dispatch_lead_us < 0 or not 0 <= self.slack_guard_fraction < 1:
            raise ValueError("need slack_guard_us >= 0, dispatch_lead_us >= 0, 0 <= slack_guard_fraction < 1")
        if self.cpu_window_us < 0 or not 0 <= self.cpu_busy_low < self.cpu_busy_high <= 1:
            raise ValueError("need cpu_window_us >= 0 and 0 <= cpu_busy_low < cpu_busy_high <= 1")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        object.__setattr__(self, "priority_by_number", by_number)

    def priority(self, number: int) -> PriorityClass:
        """The class of priority ``number``; ValueError naming the known ones otherwise."""
        try:
            return self.priority_by_number[number]
        except KeyError:
            known = sorted(self.priority_by_number)
            raise ValueError(f"unknown priority {number}; configured priorities are {known}") from None

    def guard_s(self, horizon_s: float) -> float:
        """Margin for a finish predicted ``horizon_s`` seconds from now."""
        return self.slack_guard_us / 1e6 + self.slack_guard_fraction * max(horizon_s, 0.0)

    def cpu_window_s(self, busy: float) -> float:
        """The CPU batching window (s) at host busy fraction ``busy``: 0 up to cpu_busy_low, all of
        cpu_window_us from cpu_busy_high on, linear between."""
        opened = (busy - self.cpu_busy_low) / (self.cpu_busy_high - self.cpu_busy_low)
        return self.cpu_window_us / 1e6 * min(1.0, max(0.0, opened))

    @property
    def dispatch_lead_s(self) -> float:
        return self.dispatch_lead_us / 1e6
