"""Per-model request queue ordered by deadline (EDF) — or by arrival, for the FIFO peer policies.

Kept as one sorted list per priority class, merged at the head. Within a class every request has the
same SLO, so deadlines arrive almost in order and ``insort`` is an append; the merge at the head costs
O(number of classes) per pop. The per-class split also makes the overload eviction O(log n): the victim
is the latest key of the lowest-priority class.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Iterator

from anvil_scheduler.core.request import Request

__all__ = ["EDFQueue", "QueueOrder"]

_Entry = tuple[float, int, Request]  # (sort key s, insertion sequence for FIFO ties, request)


class QueueOrder(enum.Enum):
    DEADLINE = "deadline"  # earliest deadline first (EDF); Anvil's policy
    ARRIVAL = "arrival"  # first come, first served; the Triton- and Clipper-style peers


class EDFQueue:
    """Queue of one model's waiting requests. Not thread-safe: owned by one ``SchedulerCore``."""

    def __init__(self, order: QueueOrder = QueueOrder.DEADLINE) -> None:
        self.order = order
        self._by_priority: dict[int, list[_Entry]] = {}
        self._seq = itertools.count()
        self._len = 0

    def _key(self, req: Request) -> float:
        return req.deadline_s if self.order is QueueOrder.DEADLINE else req.arrival_s

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Request]:
        """All queued requests in queue order (a copy; O(n log n))."""
        entries = sorted(e for lst in self._by_priority.values() for e in lst)
        return iter([e[2] for e in entries])

    def push(self, req: Request) -> None:
        lst = self._by_priority.setdefault(req.priority, [])
        entry = (self._key(req), next(self._seq), req)
        if not lst or entry > lst[-1]:
            lst.append(entry)
        else:
            bisect.insort(lst, entry)
        self._len += 1

    def _head_list(self) -> list[_Entry] | None:
        best: list[_Entry] | None = None
        for lst in self._by_priority.values():
            if lst and (best is None or lst[0] < best[0]):
                best = lst
        return best

    def peek(self) -> Request | None:
        """The request that leaves next (earliest key), or None."""
        lst = self._head_list()
        return lst[0][2] if lst else None

    def pop(self) -> Request:
        lst = self._head_list()
        if lst is None:
            raise IndexError("pop from an empty EDFQueue")
        self._len -= 1
        return lst.pop(0)[2]

    def pop_batch(self, n: int) -> list[Request]:
        """The ``n`` requests with the earliest keys, in order (fewer if the queue is shorter)."""
        return self._take(n, remove=True)

    def peek_batch(self, n: int) -> list[Request]:
        """What ``pop_batch(n)`` would return, without removing anything."""
        return self._take(n, remove=False)

    def _take(self, n: int, remove: bool) -> list[Request]:
        lists = [lst for lst in self._by_priority.values() if lst]
        idx = [0] * len(lists)
        out: list[Request] = []
        while len(out) < n:
            best = -1
            for i, lst in enumerate(lists):
                if idx[i] < len(lst) and (best < 0 or lst[idx[i]] < lists[best][idx[best]]):
                    best = i
            if best < 0:
                break
            out.append(lists[best][idx[best]][2])
            idx[best] += 1
        if remove:
            for i, lst in enumerate(lists):
                del lst[: idx[i]]
            self._len -= len(out)
        return out

    def remove(self, req: Request) -> None:
        """Remove a specific queued request (eviction). KeyError if it is not queued here."""
        lst = self._by_priority.get(req.priority, [])
        key = self._key(req)
        i = bisect.bisect_left(lst, (key, -1))
        while i < len(lst) and lst[i][0] == key:
            if lst[i][2] is req:
                del lst[i]
                self._len -= 1
                return
            i += 1
        raise KeyError(req.request_id)

    def count_through(self, key: float) -> int:
        """How many queued requests have a sort key <= ``key`` (work ahead of a newcomer)."""
        return sum(bisect.bisect_right(lst, (key, float("inf"))) for lst in self._by_priority.values())

    def depth_by_priority(self) -> dict[int, int]:
        return {p: len(lst) for p, lst in self._by_priority.items() if lst}

    def eviction_candidates(self, below: int, count: int, key_at_most: float = float("inf")) -> list[Request]:
        """Up to ``count`` victims for a newcomer of priority ``below``, in eviction order: requests of a
        strictly lower priority (higher number) whose key is <= ``key_at_most``; lowest priority first,
        and within a priority the latest key first. Nothing is removed."""
        out: list[Request] = []
        for p in sorted(self._by_priority, reverse=True):
            if p <= below or len(out) >= count:
                break
            lst = self._by_priority[p]
            i = bisect.bisect_right(lst, (key_at_most, float("inf")))
            while i > 0 and len(out) < count:
                i -= 1
                out.append(lst[i][2])
        return out
