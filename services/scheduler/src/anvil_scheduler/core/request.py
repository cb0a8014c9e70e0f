"""The request record, its lifecycle, and the batch that carries requests to an executor.

Lifecycle (STYLE rule 10)::

    RECEIVED ──admit──> QUEUED ──poll──> BATCHED ──handed to service──> EXECUTING ──> DONE
        │                 │                                               │ ├──────> FAILED
        └──> SHED <───────┘ (deadline / overload)         re-dispatch  <──┘ └──────> SHED
                                                        (back to QUEUED)

DONE, FAILED and SHED are terminal: the ledger has answered the request exactly once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from anvil_scheduler.core.config import PriorityClass

__all__ = ["Batch", "Request", "RequestState"]


class RequestState(enum.Enum):
    RECEIVED = "received"  # built from the wire, not yet seen by the core
    QUEUED = "queued"  # in a model's queue, waiting for a batch
    BATCHED = "batched"  # picked into a batch inside poll(); never visible outside it
    EXECUTING = "executing"  # its batch was returned by poll(): the service sends it, an executor holds it
    DONE = "done"  # answered with a result
    FAILED = "failed"  # answered with the batch's error (or its model was undeployed while it waited)
    SHED = "shed"  # answered with a shed reason (deadline / overload)

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({RequestState.DONE, RequestState.FAILED, RequestState.SHED})
_ALLOWED: dict[RequestState, frozenset[RequestState]] = {
    RequestState.RECEIVED: frozenset({RequestState.QUEUED, RequestState.SHED}),
    RequestState.QUEUED: frozenset({RequestState.BATCHED, RequestState.SHED, RequestState.FAILED}),
    RequestState.BATCHED: frozenset({RequestState.EXECUTING}),
    RequestState.EXECUTING: frozenset(
        {RequestState.DONE, RequestState.FAILED, RequestState.QUEUED, RequestState.SHED}
    ),
    RequestState.DONE: frozenset(),
    RequestState.FAILED: frozenset(),
    RequestState.SHED: frozenset(),
}


@dataclass(eq=False, slots=True)
class Request:
    """One inference request as the scheduler sees it. Identity is the object; the ledger keys by id.

    ``payload`` is opaque to the core and owned by the service (gateway routing identity, trace id,
    tensor references); the core only carries it so that a batch can be sent without a second lookup.
    """

    request_id: str
    model: str
    priority: int
    arrival_s: float  # scheduler clock (monotonic in the service, simulated in the bench)
    deadline_s: float  # arrival + min(class SLO, timeout): the latest useful finish time
    payload: object = None
    state: RequestState = RequestState.RECEIVED
    attempts: int = 0  # executions started (re-dispatch after an executor loss increments it)
    finished_s: float | None = field(default=None)  # set when answered (any terminal state)
    # The class SLO in s. Upstream time (a request that waited in a saturated gateway) tightens the
    # deadline but is not something batching can fix: the PID regulates against this budget.
    class_budget_s: float = 0.0
    # Admitted although the profile called it hopeless: it runs alone on an idle executor so that the
    # profile gets a fresh measurement (see SchedulerCore._probe_due); never shed for its prediction.
    probe: bool = False

    @classmethod
    def create(
        cls,
        request_id: str,
        model: str,
        klass: PriorityClass,
        arrival_s: float,
        timeout_s: float | None = None,
        payload: object = None,
    ) -> Request:
        """Build a request whose deadline is arrival + the class SLO, tightened (never loosened) by
        ``timeout_s``. An upstream absolute deadline is passed as ``timeout_s = deadline - arrival``."""
        if not request_id:
            raise ValueError("request_id must be a non-empty string")
        budget_s = klass.slo_ms / 1e3
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError(f"timeout_s must be > 0 (an expired request is shed), got {timeout_s}")
            budget_s = min(budget_s, timeout_s)
        return cls(
            request_id,
            model,
            klass.priority,
            arrival_s,
            arrival_s + budget_s,
            payload,
            class_budget_s=klass.slo_ms / 1e3,
        )

    @property
    def budget_s(self) -> float:
        """The request's whole latency budget (its effective SLO)."""
        return self.deadline_s - self.arrival_s

    @property
    def control_budget_s(self) -> float:
        """The budget batching is judged against: the class SLO (the effective one if unknown)."""
        return self.class_budget_s or self.budget_s

    def advance(self, new: RequestState, now_s: float | None = None) -> None:
        assert new in _ALLOWED[self.state], f"{self.request_id}: illegal transition {self.state} -> {new}"
        self.state = new
        if new.terminal:
            self.finished_s = now_s


@dataclass(eq=False, slots=True)
class Batch:
    """Requests that run together on one executor. Built by the core in poll(); the service owns sending
    it; the core keeps it in the executor's in-flight set until done, failed or the executor is lost."""

    batch_id: int
    model: str
    executor_id: str
    device: str
    requests: list[Request]
    formed_s: float  # when poll() released it
    opened_s: float  # previous release from this model's queue: members were eligible from max(arrival, this)
    predicted_exec_s: float  # profile prediction used for flow control and slack

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]
