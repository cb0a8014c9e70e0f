"""First-in-first-out batching: the foundation's placeholder policy (later replaced by EDF + PID).

Pure data structure, no I/O: the service pushes requests and pops batches; the clock is passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FifoQueues", "Pending"]


@dataclass(slots=True)
class Pending:
    """One request waiting in the scheduler; owns its frames until answered."""

    request_id: str
    model: str
    gateway: bytes  # ROUTER identity of the gateway that sent it
    envelope: Any  # the InferRequest envelope frame, forwarded to the executor unchanged
    frames: list[Any]  # its tensor payload frames
    arrival_s: float  # monotonic
    deadline_s: float  # monotonic
    trace_id: str = ""
    priority: int = 2
    attempts: int = 0


@dataclass
class FifoQueues:
    """One FIFO per model."""

    max_per_model: int
    queues: dict[str, deque[Pending]] = field(default_factory=dict)

    def push(self, item: Pending) -> bool:
        q = self.queues.setdefault(item.model, deque())
        if len(q) >= self.max_per_model:
            return False
        q.append(item)
        return True

    def push_front(self, items: list[Pending]) -> None:
        """Re-queue work of a lost executor ahead of newer arrivals, keeping its order."""
        for item in reversed(items):
            self.queues.setdefault(item.model, deque()).appendleft(item)

    def pop_batch(self, model: str, max_size: int) -> list[Pending]:
        q = self.queues.get(model)
        if not q:
            return []
        return [q.popleft() for _ in range(min(max_size, len(q)))]

    def expired(self, now_s: float) -> list[Pending]:
        """Remove and return every queued request whose deadline has passed."""
        out: list[Pending] = []
        for q in self.queues.values():
            keep = [p for p in q if p.deadline_s > now_s]
            if len(keep) != len(q):
                out.extend(p for p in q if p.deadline_s <= now_s)
                q.clear()
                q.extend(keep)
        return out

    def depth(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def models_waiting(self) -> list[str]:
        return [m for m, q in self.queues.items() if q]
