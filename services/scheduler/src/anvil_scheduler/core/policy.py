"""The batching-policy contract: the boundary between the core's shared machinery and a policy.

The core (``SchedulerCore``) owns everything stateful that all policies share — the per-model queues,
admission and shedding, the executor pool and its credits, the latency profiles, the ledger, the SLO
tracker. A policy answers two questions and may learn from completions:

* ``batch_limit(model)`` — how large may the next batch of ``model`` be (B*)?
* ``release_at(view)`` — given the queue's head and the executor the batch would go to, should the batch
  leave now, or at what time should the core ask again?
* ``observe_arrival(request, best_finish_s, now_s)`` / ``observe(batch, exec_s, now_s)`` — feedback
  at each arrival and after each completed batch, for policies that learn (PID, AIMD).

Plus two class attributes that select shared machinery: the queue ``order`` and whether the core
``sheds`` hopeless work for this policy (deadline shedding and the work-ahead admission test). Every
method is called from the core's single thread with the core's clock; a policy does no I/O, keeps no
reference to requests or batches after a call returns, and never mutates them: the core owns them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from anvil_scheduler.core.edf import QueueOrder
from anvil_scheduler.core.request import Batch, Request

__all__ = ["BatchingPolicy", "QueueView"]


@dataclass(frozen=True, slots=True)
class QueueView:
    """A model's queue as a policy sees it at one release decision. Valid only during the call."""

    model: str
    now_s: float
    depth: int  # queued requests of this model (>= 1)
    head: Request  # the request that leaves first (earliest deadline, or oldest under FIFO)
    cap: int  # the batch that would leave now has min(depth, cap) requests
    start_s: float  # predicted start of that batch on the executor it would go to (>= now_s)
    executor_idle: bool  # that executor's in-flight work ends within the dispatch lead
    guard_s: float  # margin the core keeps before a deadline for this batch (config.guard_s)
    predict_s: Callable[[int], float]  # batch size -> predicted execution seconds on that executor
    # The earliest a batch the policy wants released should leave for that executor: now, or with
    # late binding, when the busy executor is about to free up (Placement.bind_s).
    bind_s: float = 0.0
    # How long after its head arrived a batch may wait for more requests although the executor is
    # idle (SchedulerConfig.cpu_window_us: the host's CPUs are busy); 0 for a batch led by the top
    # priority and while the CPUs have room.
    cpu_window_s: float = 0.0

    @property
    def size(self) -> int:
        return min(self.depth, self.cap)


class BatchingPolicy(abc.ABC):
    """Base of all batching policies. Subclasses implement ``release_at`` and usually one more method."""

    name: ClassVar[str]
    order: ClassVar[QueueOrder] = QueueOrder.DEADLINE
    sheds: ClassVar[bool] = True  # False for peers that execute everything, late or not

    def __init__(self) -> None:
        self._max_batch: dict[str, int] = {}
        self._predict: dict[str, Callable[[int], float]] = {}

    def bind(self, model: str, max_batch: int, predict_s: Callable[[int], float]) -> None:
        """Called by the core when ``model`` is registered and whenever its effective max batch changes
        (model limit and the largest executor that loads it, e.g. an executor joined or was lost).
        ``max_batch >= 1``; ``predict_s(n)`` is the live profile prediction of a batch of n of the model on
        its fastest device (the policy may call it at any later time). Subclasses that keep per-model
        state extend this and call super()."""
        assert max_batch >= 1, f"{model}: max_batch must be >= 1"
        self._max_batch[model] = max_batch
        self._predict[model] = predict_s

    def forget(self, model: str) -> None:
        """Called by ``SchedulerCore.remove_model`` when ``model`` was undeployed: drop its state
        (``bind`` starts it afresh if it comes back). Subclasses with per-model state extend it."""
        self._max_batch.pop(model, None)
        self._predict.pop(model, None)

    def max_batch(self, model: str) -> int:
        return self._max_batch[model]

    def predict_s(self, model: str, batch_size: int) -> float:
        """Predicted execution seconds of a batch of ``batch_size`` on the model's fastest device."""
        return self._predict[model](batch_size)

    def batch_limit(self, model: str) -> int:
        """Called by the core before every release decision and admission test of ``model``: the size
        of the next full batch (B*), in [1, max_batch(model)]. Default: the model's max batch."""
        return self._max_batch[model]

    @abc.abstractmethod
    def release_at(self, view: QueueView) -> float:
        """Called by ``SchedulerCore.poll`` for a model with queued work, once an executor with a free
        credit has been chosen for its next batch. Return a time <= ``view.now_s`` to release the batch
        now; a later time to be polled again then (the core turns it into ``next_wakeup_s``); or
        ``math.inf`` to wait for the next arrival or completion."""

    def observe_arrival(self, request: Request, best_finish_s: float, now_s: float) -> None:  # noqa: B027
        """Called by ``SchedulerCore.admit`` for every new (non-duplicate) request of a model that some
        executor hosts, before the admission decision. ``best_finish_s`` is the earliest the request could
        finish on its own: the first time an executor of its model comes free (predicted from in-flight
        work) plus the predicted time of a batch of one. ``request`` is read-only. Default: no-op."""

    def observe(self, batch: Batch, exec_s: float, now_s: float) -> None:  # noqa: B027 - optional hook
        """Called by ``SchedulerCore.on_batch_done`` once per completed batch, after the profile and SLO
        tracker were updated and the requests were answered. ``batch`` is read-only here. Default: no-op."""
