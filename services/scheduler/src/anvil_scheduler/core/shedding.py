"""Shedding: why a request is answered with an error instead of a result, and how many to evict.

Two reasons, both answered at once and counted per (reason, priority):

* ``DEADLINE`` — the request cannot finish by its deadline even in a batch of one on the fastest free
  path. Executing it would burn capacity on an answer nobody can use.
* ``OVERLOAD`` — it could finish alone, but not behind the work already queued ahead of it (the
  work-ahead test), or the queue's hard bound is reached. Lower priorities go first: a newcomer evicts
  lower-priority requests ahead of it (lowest priority, latest deadline first) when that makes it
  feasible; otherwise the newcomer itself is shed — except the top priority, which is shed only when
  hopeless (even a batch of one, started where dispatch would start its urgent batch, misses).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from anvil_scheduler.core.request import Request

__all__ = ["Shed", "ShedCounters", "ShedReason", "evictions_needed"]


class ShedReason(enum.Enum):
    DEADLINE = "deadline"
    OVERLOAD = "overload"


@dataclass(frozen=True)
class Shed:
    """A request to answer now with an error carrying ``reason``. The core has closed it in the ledger."""

    request: Request
    reason: ShedReason


class ShedCounters:
    """Shed counts by (reason, priority) — the service exports them as a labelled counter."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[ShedReason, int]] = Counter()

    def add(self, shed: Shed) -> None:
        self.counts[(shed.reason, shed.request.priority)] += 1

    def total(self, reason: ShedReason | None = None) -> int:
        return sum(n for (r, _), n in self.counts.items() if reason is None or r is reason)


def evictions_needed(
    position: int, deadline_s: float, finish_at: Callable[[int], float], candidates: int
) -> int | None:
    """How many requests ahead must leave for the newcomer at 1-based ``position`` to finish by
    ``deadline_s``, given ``finish_at(position) -> predicted finish`` (non-decreasing in position).
    0 if it is feasible as is; None if even removing all ``candidates`` does not make it feasible."""
    if finish_at(position) <= deadline_s:
        return 0
    candidates = min(candidates, position - 1)
    if candidates <= 0 or finish_at(position - candidates) > deadline_s:
        return None
    lo, hi = 1, candidates  # finish_at(position - hi) is feasible; search the fewest evictions
    while lo < hi:
        mid = (lo + hi) // 2
        if finish_at(position - mid) <= deadline_s:
            hi = mid
        else:
            lo = mid + 1
    return lo
