"""``SchedulerCore``: the I/O-free scheduler. The service (or the simulator) feeds it events with its
clock and carries out the decisions it returns.

Calls, all from one thread, with a non-decreasing ``now_s``:

* ``register_model`` / ``register_executor`` / ``on_executor_lost`` — capacity changes;
  ``remove_model`` when a model is undeployed (its queued requests come back to be answered).
* ``admit(request, now_s)`` on every arrival: queue it, or shed it (and/or evict lower priorities).
* ``poll(now_s)`` after every arrival and completion and at ``next_wakeup_s``: batches to send now,
  requests to answer with a shed reason now, and when to call again.
* ``on_batch_done`` / ``on_batch_failed`` when an executor reports.

Ownership: a ``Request`` belongs to the core from ``admit`` until it appears in an answer list
(``Admission.shed``, ``Decision.shed``, ``Completion.answered``, ``Release.failed``/``shed``); then the
ledger has closed it and the service owns the reply. A ``Batch`` returned by ``poll`` is the service's to
send; the core keeps tracking it (credits, re-dispatch) until the executor reports or is lost.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from anvil_scheduler.core.config import SchedulerConfig
from anvil_scheduler.core.dispatch import ExecutorPool, ExecutorSpec, Predictor
from anvil_scheduler.core.edf import EDFQueue
from anvil_scheduler.core.learning import Learning
from anvil_scheduler.core.ledger import RequestLedger
from anvil_scheduler.core.policy import BatchingPolicy, QueueView
from anvil_scheduler.core.profile import ProfileBook, ProfilePrior
from anvil_scheduler.core.request import Batch, Request, RequestState
from anvil_scheduler.core.shedding import Shed, ShedCounters, ShedReason, evictions_needed
from anvil_scheduler.core.slo import SLOTracker

__all__ = ["Accounting", "Admission", "AdmitOutcome", "Completion", "Decision", "Release", "SchedulerCore"]


class AdmitOutcome(enum.Enum):
    QUEUED = "queued"
    SHED = "shed"  # the newcomer is in Admission.shed: answer it now
    DUPLICATE = "duplicate"  # id already open or recently answered: do not answer this copy


@dataclass(frozen=True)
class Admission:
    outcome: AdmitOutcome
    shed: tuple[Shed, ...] = ()  # answer each now: the newcomer when SHED, and any evicted requests


@dataclass(frozen=True)
class Decision:
    batches: tuple[Batch, ...]  # send each to batch.executor_id now
    shed: tuple[Shed, ...]  # answer each now with its reason
    next_wakeup_s: float | None  # call poll() again at this time if no other event comes first


@dataclass(frozen=True)
class Completion:
    answered: tuple[Request, ...]  # deliver each its result
    late: tuple[str, ...]  # request ids whose results must be dropped (already answered or given up)


@dataclass(frozen=True)
class Release:
    """Requests that came back from a failed batch or a lost executor."""

    requeued: tuple[Request, ...]  # back in their queue at their original deadlines; poll() re-dispatches
    failed: tuple[Request, ...]  # answer each with the batch's error (out of attempts, or not retryable)
    shed: tuple[Shed, ...]  # can no longer meet their deadline: answer each now


@dataclass(frozen=True)
class Accounting:
    """What the core holds right now. Idle means zero: every field returns to 0 once every admitted
    request has been answered, whichever way it left (see ``SchedulerCore.idle_violations``)."""

    queued_requests: int  # in a model's queue
    in_flight_batches: int  # sent to an executor, not yet reported (done, failed) nor lost
    in_flight_requests: int
    open_requests: int  # admitted ids not yet answered (the ledger's open set)
    work_ahead_s: float  # predicted in-flight execution still ahead, summed over executors


class SchedulerCore:
    """Queues, batching, shedding, dispatch and bookkeeping for a set of models and executors."""

    def __init__(
        self, policy: BatchingPolicy, config: SchedulerConfig | None = None, prior: ProfilePrior | None = None
    ) -> None:
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.profiles = ProfileBook(prior)
        self.pool = ExecutorPool(self.config.reserved_credits)
        self.ledger = RequestLedger(self.config.dedup_window_s)
        self.slo = SLOTracker(self.config.slo_window_s)
        self.sheds = ShedCounters()
        self.batch_sizes: dict[str, deque[tuple[float, int]]] = {}  # model -> (release time, size)
        self._queues: dict[str, EDFQueue] = {}
        self._model_max: dict[str, int] = {}
        self._last_release_s: dict[str, float] = {}
        self._retired: OrderedDict[int, tuple[float, tuple[str, ...]]] = OrderedDict()
        self._batch_ids = itertools.count(1)
        self._now_s = -math.inf
        self._top_priority = min(p.priority for p in self.config.priorities)
        self.cpu_busy = 0.0  # the host's CPU busy fraction (set_host_cpu), 0..1
        self._cpu_window_s = 0.0  # the CPU batching window it opens (config.cpu_window_s)
        self.learning = Learning(self.config.probe_interval_s)  # warm-up exclusion, probes

    # ---- capacity -------------------------------------------------------------------------------
    def set_host_cpu(self, busy: float) -> float:
        """The host's CPU busy fraction (0..1, the service's /proc/stat reading); returns the CPU
        batching window (s) it opens for batches not led by the top priority."""
        self.cpu_busy = min(1.0, max(0.0, busy))
        self._cpu_window_s = self.config.cpu_window_s(self.cpu_busy)
        return self._cpu_window_s

    @property
    def cpu_window_s(self) -> float:
        return self._cpu_window_s

    def register_model(self, model: str, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"model {model!r}: max_batch must be >= 1, got {max_batch}")
        self._model_max[model] = max_batch
        self._queues.setdefault(model, EDFQueue(self.policy.order))
        self.batch_sizes.setdefault(model, deque(maxlen=self.config.batch_history_len))
        self._last_release_s.setdefault(model, -math.inf)
        self._rebind(model)

    def register_executor(self, spec: ExecutorSpec, now_s: float) -> None:
        """Add or update an executor (a re-registration keeps its in-flight batches)."""
        self._tick(now_s)
        self.pool.register(spec)
        for model in spec.models & self._model_max.keys():
            self._rebind(model)

    def on_executor_lost(self, executor_id: str, now_s: float) -> Release:
        """The executor stopped heartbeating: its in-flight requests go back to their queues."""
        self._tick(now_s)
        batches = self.pool.remove(executor_id)
        self.learning.forget_executor(executor_id)
        for model in {b.model for b in batches} | set(self._model_max):
            self._rebind(model)
        return self._release([r for b in batches for r in self._retire(b, now_s)], now_s, retryable=True)

    def remove_model(self, model: str, now_s: float) -> tuple[Request, ...]:
        """``model`` was undeployed: returns its queued requests (FAILED: answer each with an error)
        and drops its queue, policy, profile and learning state, and the model from every executor's
        spec. Batches in flight stay tracked and are answered when their executor reports."""
        self._tick(now_s)
        queue = self._queues.pop(model, None)
        if queue is None:
            return ()
        failed = queue.pop_batch(len(queue))
        for r in failed:
            self.ledger.close(r.request_id, now_s)
            r.advance(RequestState.FAILED, now_s)
        for spec in self.pool.specs():
            if model in spec.models:
                self.pool.register(dataclasses.replace(spec, models=spec.models - {model}))
        for table in (self._model_max, self.batch_sizes, self._last_release_s):
            table.pop(model, None)
        self.policy.forget(model)
        self.profiles.forget(model)
        self.learning.forget_model(model)
        return tuple(failed)

    def _rebind(self, model: str) -> None:
        if model not in self._model_max:
            return  # removed while a batch of it was in flight
        hosted = self.pool.max_batch(model)
        limit = min(self._model_max[model], hosted) if hosted else self._model_max[model]
        self.policy.bind(model, limit, functools.partial(self._fastest_s, model))

    # ---- requests -------------------------------------------------------------------------------
    def new_request(
        self,
        request_id: str,
        model: str,
        priority: int,
        now_s: float,
        timeout_s: float | None = None,
        payload: object = None,
    ) -> Request:
        """A request arriving now, with deadline = now + its class SLO, tightened by ``timeout_s``."""
        return Request.create(request_id, model, self.config.priority(priority), now_s, timeout_s, payload)

    def admit(self, req: Request, now_s: float) -> Admission:
        self._tick(now_s)
        queue = self._queues.get(req.model)
        if queue is None:
            raise ValueError(f"unknown model {req.model!r}; registered: {sorted(self._queues)}")
        assert req.state is RequestState.RECEIVED, f"{req.request_id} admitted twice ({req.state})"
        if not self.ledger.open(req.request_id, now_s):
            return Admission(AdmitOutcome.DUPLICATE)
        if self.pool.max_batch(req.model):
            best_finish_s = self.pool.earliest_finish(req.model, 1, self._predictor(req.model), now_s)
            self.policy.observe_arrival(req, best_finish_s, now_s)
        evicted: list[Request] = []
        if self.policy.sheds:
            # Alone on an idle executor nothing waits behind it and it waits behind nothing: shedding it
            # protects nobody, and only a request that runs can correct a wrong prediction.
            alone = not queue and self.pool.idle_host(req.model) is not None
            if now_s + self._exec1_s(req.model) > req.deadline_s:
                if not (alone and self.learning.probe_due(req.model, req.priority, now_s)):
                    return Admission(AdmitOutcome.SHED, (self._shed(req, ShedReason.DEADLINE, now_s),))
                req.probe = True
            elif not alone:  # alone, nothing is queued ahead to evict and it is never shed for that
                victims = self._work_ahead_victims(queue, req, now_s)
                if isinstance(victims, ShedReason):
                    return Admission(AdmitOutcome.SHED, (self._shed(req, victims, now_s),))
                evicted.extend(victims)
        if len(queue) - len(evicted) >= self.config.max_queue_depth:
            spare = [v for v in queue.eviction_candidates(req.priority, len(evicted) + 1) if v not in evicted]
            if not spare:
                return Admission(AdmitOutcome.SHED, (self._shed(req, ShedReason.OVERLOAD, now_s),))
            evicted.append(spare[0])
        sheds = []
        for victim in evicted:
            queue.remove(victim)
            sheds.append(self._shed(victim, ShedReason.OVERLOAD, now_s))
        req.advance(RequestState.QUEUED)
        queue.push(req)
        return Admission(AdmitOutcome.QUEUED, tuple(sheds))

    def _work_ahead_victims(self, queue: EDFQueue, req: Request, now_s: float) -> list[Request] | ShedReason:
        """Lower-priority requests ahead of ``req`` to evict so that it meets its deadline behind the
        queued work ([] if it already does); if evicting cannot make it feasible, why ``req`` is shed:
        OVERLOAD, or DEADLINE for the top priority, which is refused only when hopeless."""
        if not self.pool.max_batch(req.model):
            return []  # nothing hosts the model yet: no basis for a prediction
        cap = self.policy.batch_limit(req.model)
        position = queue.count_through(req.deadline_s) + 1
        # Top-priority work leaves in urgent batches (poll: the head is of the top priority), which the
        # executor runs before its queued lower-priority batches: predict its start where dispatch will.
        head = queue.peek()
        urgent = req.priority == self._top_priority and (
            head is None or head.deadline_s > req.deadline_s or head.priority == self._top_priority
        )

        def finish_at(pos: int) -> float:
            return self.pool.predict_finish(req.model, pos, cap, self._predictor(req.model), now_s, urgent)

        def guarded_finish_at(pos: int) -> float:
            finish = finish_at(pos)
            return finish + self.config.guard_s(finish - now_s)

        if guarded_finish_at(position) <= req.deadline_s:
            return []
        candidates = queue.eviction_candidates(req.priority, position - 1, req.deadline_s)
        needed = evictions_needed(position, req.deadline_s, guarded_finish_at, len(candidates))
        if needed is not None:
            return candidates[:needed]
        predict = self._predictor(req.model)
        if req.priority == self._top_priority and (
            self.pool.predict_finish(req.model, 1, cap, predict, now_s, urgent=True) <= req.deadline_s
        ):
            # The top priority is refused only when hopeless: first in an urgent batch of one it could
            # still finish in time. The queue's head check sheds it (deadline) if it turns hopeless while
            # the work ahead of it drains; everything of a lower priority ahead of it goes first.
            return candidates
        return ShedReason.DEADLINE if req.priority == self._top_priority else ShedReason.OVERLOAD

    # ---- release decisions ----------------------------------------------------------------------
    def poll(self, now_s: float) -> Decision:
        self._tick(now_s)
        batches: list[Batch] = []
        sheds: list[Shed] = []
        wake = math.inf
        lead_s = self.config.dispatch_lead_s
        for model, queue in self._by_urgency():
            predict = self._predictor(model)
            while queue:
                head = queue.peek()
                assert head is not None
                if self.policy.sheds and not head.probe and now_s >= self._hopeless_at_s(head):
                    sheds.append(self._shed(queue.pop(), ShedReason.DEADLINE, now_s))
                    continue
                cap = self.policy.batch_limit(model)
                # A batch led by top-priority work may take a reserved credit (and runs first); the head
                # always rides in the batch formed below, so the reserve serves only such batches.
                urgent = head.priority == self._top_priority
                place = self.pool.place(model, len(queue), cap, predict, now_s, lead_s, urgent)
                if place is None:
                    break  # no executor of this model has a credit: a completion will poll again
                guard_s = self.config.guard_s(place.finish_s - now_s)
                view = QueueView(
                    model,
                    now_s,
                    len(queue),
                    head,
                    place.cap,
                    place.start_s,
                    place.idle,
                    guard_s,
                    functools.partial(predict, place.device),
                    place.bind_s if self.config.late_binding and not urgent else now_s,
                    0.0 if urgent else self._cpu_window_s,
                )
                at = self.policy.release_at(view)
                if at > now_s:
                    wake = min(wake, at)
                    break
                size = place.size
                if self.policy.sheds and not head.probe:
                    alone = len(queue) == 1 and not self.pool.in_flight(place.executor_id)
                    size = self._fit(
                        queue, place.size, place.cap, place.start_s, view.predict_s, now_s, alone
                    )
                    if size == 0:
                        # Overload if a shrunk batch could still have served it; deadline if nothing could.
                        alone_s = place.start_s + predict(place.device, 1)
                        reason = ShedReason.OVERLOAD if alone_s <= head.deadline_s else ShedReason.DEADLINE
                        sheds.append(self._shed(queue.pop(), reason, now_s))
                        continue
                reqs = queue.pop_batch(size)
                batches.append(self._form(model, reqs, place.executor_id, place.device, now_s, urgent))
            head = queue.peek()
            if head is not None and self.policy.sheds and not head.probe:
                wake = min(wake, self._hopeless_at_s(head))  # wake when the head turns hopeless: answer it
            elif head is not None and not self.pool.max_batch(model):
                # Nothing hosts the model any more (its executors were lost): a peer policy sheds
                # nothing, so answer each request at its deadline rather than hold it forever.
                while (head := queue.peek()) is not None and now_s >= head.deadline_s:
                    sheds.append(self._shed(queue.pop(), ShedReason.DEADLINE, now_s))
                if head is not None:
                    wake = min(wake, head.deadline_s)
        return Decision(tuple(batches), tuple(sheds), wake if wake < math.inf else None)

    def _fit(
        self,
        queue: EDFQueue,
        full: int,
        cap: int,
        start_s: float,
        predict: Callable[[int], float],
        now_s: float,
        alone: bool = False,
    ) -> int:
        """Size of the batch to release so that its earliest deadline (the head's) is met; 0 = shed the head.

        A batch shrinks until the head fits, down to one, except under backlog (a full batch is waiting):
        there a shrunk batch costs capacity that the whole queue needs, so it shrinks only for a head of
        the top priority, which is refused only when hopeless (#19: under a CPU hog the live stack shed
        priority-1 heads that a batch of one would have served, to keep a batch of two priority-1
        requests full). A request ``alone`` on an idle executor is no backlog and is never shed for
        overload: it goes if it can finish by its deadline without the guard."""
        head = queue.peek()
        assert head is not None

        def meets(size: int) -> bool:
            finish = start_s + predict(size)
            return finish + self.config.guard_s(finish - now_s) <= head.deadline_s

        if meets(full):
            return full
        size = full
        while size > 1 and not meets(size):
            size -= 1
        if start_s + predict(size) > head.deadline_s:
            return 0
        if alone:
            return size
        if full >= cap and head.priority != self._top_priority:  # backlog
            return 0
        return size

    def _form(
        self, model: str, reqs: list[Request], executor_id: str, device: str, now_s: float, urgent: bool
    ) -> Batch:
        batch = Batch(
            next(self._batch_ids),
            model,
            executor_id,
            device,
            reqs,
            now_s,
            self._last_release_s[model],
            self.profiles.predict_s(model, device, len(reqs)),
        )
        self._last_release_s[model] = now_s
        for r in reqs:
            r.advance(RequestState.BATCHED)
        self.pool.assign(batch, now_s, urgent)
        for r in reqs:
            r.advance(RequestState.EXECUTING)
            r.attempts += 1
        self.batch_sizes[model].append((now_s, len(reqs)))
        return batch

    def _by_urgency(self) -> list[tuple[str, EDFQueue]]:
        """Non-empty queues, the one whose head leaves first ahead, so scarce credits go there."""
        busy = [(q.peek(), m, q) for m, q in self._queues.items() if q]
        busy.sort(key=lambda t: (t[0].deadline_s if t[0] else math.inf, t[1]))
        return [(m, q) for _, m, q in busy]

    # ---- executor reports -----------------------------------------------------------------------
    def on_batch_done(self, batch_id: int, executor_id: str, exec_time_s: float, now_s: float) -> Completion:
        """Results of a batch arrived. ``exec_time_s`` is the executor's own timing of the batch."""
        self._tick(now_s)
        batch = self.pool.complete(batch_id, executor_id, now_s, exec_time_s)
        if batch is None:
            _, ids = self._retired.pop(batch_id, (now_s, ()))
            self.ledger.drop_late(len(ids))
            return Completion((), ids)
        known = batch.model in self._model_max  # False: undeployed while this batch ran
        if known and self.learning.is_sample(executor_id, batch.model, batch.size):  # not warm-up
            self.profiles.get(batch.model, batch.device).observe(batch.size, exec_time_s, now_s)
        answered, late = [], []
        for r in batch.requests:
            if self.ledger.close(r.request_id, now_s):
                r.advance(RequestState.DONE, now_s)
                self.slo.record(r.priority, now_s <= r.deadline_s, now_s, now_s - r.arrival_s)
                answered.append(r)
            else:
                late.append(r.request_id)
        if known:
            self.policy.observe(batch, exec_time_s, now_s)
        return Completion(tuple(answered), tuple(late))

    def on_batch_failed(
        self, batch_id: int, executor_id: str, now_s: float, retryable: bool = True
    ) -> Release:
        """The executor reported an error for the batch. Retryable errors re-queue its requests (up to
        ``max_attempts``); others answer every request with the error (STYLE rule 9)."""
        self._tick(now_s)
        batch = self.pool.complete(batch_id, executor_id, now_s)
        if batch is None:
            return Release((), (), ())
        return self._release(self._retire(batch, now_s), now_s, retryable)

    def _retire(self, batch: Batch, now_s: float) -> list[Request]:
        """Remember a given-up batch so a result that still arrives for it is recognised and dropped."""
        self._retired[batch.batch_id] = (now_s, tuple(batch.request_ids))
        return batch.requests

    def _release(self, reqs: list[Request], now_s: float, retryable: bool) -> Release:
        requeued, failed, sheds = [], [], []
        for r in reqs:
            if not retryable or r.attempts >= self.config.max_attempts or r.model not in self._queues:
                self.ledger.close(r.request_id, now_s)
                r.advance(RequestState.FAILED, now_s)
                self.slo.record(r.priority, False, now_s)
                failed.append(r)
            elif self.policy.sheds and now_s + self._exec1_s(r.model) > r.deadline_s:
                sheds.append(self._shed(r, ShedReason.DEADLINE, now_s))
            else:
                r.advance(RequestState.QUEUED)
                self._queues[r.model].push(r)
                requeued.append(r)
        return Release(tuple(requeued), tuple(failed), tuple(sheds))

    # ---- helpers --------------------------------------------------------------------------------
    def _shed(self, req: Request, reason: ShedReason, now_s: float) -> Shed:
        closed = self.ledger.close(req.request_id, now_s)
        assert closed, f"{req.request_id} shed after it was answered"
        req.advance(RequestState.SHED, now_s)
        shed = Shed(req, reason)
        self.sheds.add(shed)
        self.slo.record(req.priority, False, now_s)
        return shed

    def _predictor(self, model: str) -> Predictor:
        return functools.partial(self.profiles.predict_s, model)

    def _hopeless_at_s(self, req: Request) -> float:
        """From this time on, ``req`` cannot finish by its deadline even alone."""
        return req.deadline_s - self._exec1_s(req.model)

    def _exec1_s(self, model: str) -> float:
        return self._fastest_s(model, 1)

    def _fastest_s(self, model: str, batch_size: int) -> float:
        """Fastest predicted time of a batch, over the devices that load the model (prior if none)."""
        devices = {s.device for s in self.pool.specs() if model in s.models}
        if not devices:
            return self.profiles.prior.predict_s(batch_size)
        return min(self.profiles.predict_s(model, d, batch_size) for d in devices)

    def _tick(self, now_s: float) -> None:
        assert now_s >= self._now_s, f"clock went backwards: {now_s} < {self._now_s}"
        self._now_s = now_s
        self.profiles.tick(now_s)
        horizon = now_s - self.config.dedup_window_s
        while self._retired and next(iter(self._retired.values()))[0] < horizon:
            self._retired.popitem(last=False)

    # ---- metrics --------------------------------------------------------------------------------
    def queue_depth(self) -> dict[tuple[str, int], int]:
        """(model, priority) -> queued requests."""
        return {(m, p): n for m, q in self._queues.items() for p, n in q.depth_by_priority().items()}

    def accounting(self, now_s: float) -> Accounting:
        """The request state the core holds now (exported as gauges by the service)."""
        batches = [b for spec in self.pool.specs() for b in self.pool.in_flight(spec.executor_id)]
        work = sum(self.pool.work_ahead_s(spec.executor_id, now_s) for spec in self.pool.specs())
        return Accounting(
            queued_requests=sum(len(q) for q in self._queues.values()),
            in_flight_batches=len(batches),
            in_flight_requests=sum(b.size for b in batches),
            open_requests=self.ledger.open_count,
            work_ahead_s=work,
        )

    def idle_violations(self, now_s: float) -> list[str]:
        """Idle means zero: with no request outstanding, what the core still holds (empty when sound).
        Tests call it after every scenario; the service exports the same numbers as gauges."""
        acc = self.accounting(now_s)
        return [f"{name} = {value}" for name, value in vars(acc).items() if value]

    def target_batch(self, model: str) -> int:
        """B*: the size of the next full batch of ``model``."""
        return self.policy.batch_limit(model)

    def models(self) -> list[str]:
        return list(self._queues)

    def has_model(self, model: str) -> bool:
        """Whether `model` is registered (what `model in models()` says, without building the list)."""
        return model in self._queues
