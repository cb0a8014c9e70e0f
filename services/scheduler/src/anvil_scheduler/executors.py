"""The scheduler's view of the executors connected to it: capacity, credits, in-flight batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from anvil_scheduler.fifo import Pending

__all__ = ["ExecutorPool", "ExecutorState"]


@dataclass
class ExecutorState:
    identity: bytes  # ROUTER identity (the executor's service id)
    service_id: str
    device: str
    max_batch: int
    credits: int  # max batches in flight (flow control)
    models: set[str]
    last_seen_s: float
    inflight: dict[str, list[Pending]] = field(default_factory=dict)  # batch_id -> requests

    @property
    def free_credits(self) -> int:
        return self.credits - len(self.inflight)


class ExecutorPool:
    def __init__(self) -> None:
        self.executors: dict[bytes, ExecutorState] = {}

    def upsert(self, state: ExecutorState) -> ExecutorState:
        """Register (or refresh after a re-register) keeping any batches already in flight."""
        old = self.executors.get(state.identity)
        if old is not None:
            state.inflight = old.inflight
        self.executors[state.identity] = state
        return state

    def seen(self, identity: bytes, now_s: float) -> ExecutorState | None:
        state = self.executors.get(identity)
        if state is not None:
            state.last_seen_s = now_s
        return state

    def pick(self, model: str) -> ExecutorState | None:
        """The executor serving `model` with the most free credits (least loaded); None if all busy."""
        best: ExecutorState | None = None
        for ex in self.executors.values():
            if (
                model in ex.models
                and ex.free_credits > 0
                and (best is None or ex.free_credits > best.free_credits)
            ):
                best = ex
        return best

    def serves(self, model: str) -> bool:
        return any(model in ex.models for ex in self.executors.values())

    def remove(self, identity: bytes) -> list[Pending]:
        """Forget an executor; return the requests of its in-flight batches for re-dispatch."""
        state = self.executors.pop(identity, None)
        if state is None:
            return []
        return [p for batch in state.inflight.values() for p in batch]

    def silent(self, now_s: float, timeout_s: float) -> list[bytes]:
        return [i for i, ex in self.executors.items() if now_s - ex.last_seen_s > timeout_s]
