"""Exactly-once bookkeeping by request id.

A request id is *open* from admission until it is answered (result, error or shed), then *closed* and
remembered for ``retention_s`` so that a duplicate submission or a second answer for it is recognised.
Answers come only through ``close``: the first call wins, every later one is refused and counted.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["RequestLedger"]


class RequestLedger:
    """Open and recently-answered request ids. Owned by one ``SchedulerCore``; single-threaded."""

    def __init__(self, retention_s: float) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s}")
        self.retention_s = retention_s
        self._open: set[str] = set()
        self._closed: OrderedDict[str, float] = OrderedDict()  # id -> when answered (append order)
        self.duplicates_rejected = 0  # submissions of an id that is open or recently answered
        self.late_results_dropped = 0  # answers for an id that was already answered

    def open(self, request_id: str, now_s: float) -> bool:
        """Admit ``request_id``; False (and counted) if it is open or was answered recently."""
        self.expire(now_s)
        if request_id in self._open or request_id in self._closed:
            self.duplicates_rejected += 1
            return False
        self._open.add(request_id)
        return True

    def close(self, request_id: str, now_s: float) -> bool:
        """Record the answer; True exactly once per admitted id. A refused answer is counted as a late
        result, which the caller must drop."""
        if request_id not in self._open:
            self.late_results_dropped += 1
            return False
        self._open.remove(request_id)
        self._closed[request_id] = now_s
        return True

    def drop_late(self, count: int = 1) -> None:
        """Count results that arrived for batches the core had already given up on."""
        self.late_results_dropped += count

    def is_open(self, request_id: str) -> bool:
        return request_id in self._open

    def answered(self, request_id: str) -> bool:
        return request_id in self._closed

    @property
    def open_count(self) -> int:
        return len(self._open)

    def expire(self, now_s: float) -> None:
        """Forget answered ids older than the retention window."""
        horizon = now_s - self.retention_s
        while self._closed:
            _, t = next(iter(self._closed.items()))
            if t > horizon:
                break
            self._closed.popitem(last=False)
