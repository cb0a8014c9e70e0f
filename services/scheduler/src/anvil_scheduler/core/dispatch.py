"""The executor pool: registered capacity, credit-based flow control, least-predicted-finish placement.

Each executor runs its in-flight batches in order on its ``lanes`` (compute lanes: that many batches
at once, taken from its one queue as lanes free up; 1 unless it registered more). The pool tracks,
per lane, a predicted time at which the lane's work ends, moved forward by each assignment's
predicted execution time (onto the lane that frees first) and re-anchored at every completion. A
batch goes to the executor, among those that load the model and hold a free credit, whose
``max(now, free_at) + predict(batch)`` is smallest, ``free_at`` being its first lane to free up: a
laned executor with a lane free takes a batch at once, as an idle one-lane executor does.

**Reserved credits** (issue #19): an *urgent* batch (one led by top-priority work) may use
``reserved`` credits beyond the executor's own when lower-priority batches hold them all and one of
those waits behind the running batch, so it never waits in the scheduler for such a credit. The
executor runs queued batches most urgent first (its work queue), so an urgent batch waits at most
for the batch that is running, not for the ones queued ahead of it; its predicted start is the end of
the running batch plus the urgent batches already queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from anvil_scheduler.core.request import Batch

__all__ = ["ExecutorPool", "ExecutorSpec", "Placement", "Predictor"]

Predictor = Callable[[str, int], float]  # (device, batch size) -> predicted execution seconds
_OVERHEAD_GAIN = 0.1  # EWMA weight of one batch's overhead sample: follows load within ~10 batches


@dataclass(frozen=True)
class ExecutorSpec:
    """What an executor registers. ``credits`` = batches it accepts in flight (1 running + queued)."""

    executor_id: str
    device: str  # profile key, e.g. "h200", "cpu"
    max_batch: int
    models: frozenset[str]
    credits: int = 2
    lanes: int = 1  # batches it runs at once

    def __post_init__(self) -> None:
        if not self.executor_id:
            raise ValueError("executor_id must be a non-empty string")
        if self.max_batch < 1:
            raise ValueError(f"executor {self.executor_id}: max_batch must be >= 1, got {self.max_batch}")
        if self.credits < 1:
            raise ValueError(f"executor {self.executor_id}: credits must be >= 1, got {self.credits}")
        if not 1 <= self.lanes <= 16:
            raise ValueError(f"executor {self.executor_id}: lanes must be in 1..16, got {self.lanes}")


@dataclass
class _Executor:
    spec: ExecutorSpec
    in_flight: dict[int, Batch] = field(default_factory=dict)  # insertion order (urgent ones run first)
    lanes_free_s: list[float] = field(default_factory=list)  # per lane: predicted end of its work
    urgent: set[int] = field(default_factory=set)  # ids of in-flight batches sent as urgent
    alone: set[int] = field(default_factory=set)  # ids of batches sent when nothing else was in flight
    # Per-batch time besides execution (links, both services' handling), EWMA of round trip - execution
    # time over batches sent alone (s). On a GPU it is small beside the batch; on the 2-core CPU stack
    # it was ~0.6 ms idle and 4 ms under load for 0.2 ms batches, and without it the pool called the
    # executor idle long before the result came back: batches of 1-2 left back to back and their
    # per-batch CPU starved the gateway (#19).
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.lanes_free_s) != self.spec.lanes:
            self.lanes_free_s = [float("-inf")] * self.spec.lanes

    @property
    def free_at_s(self) -> float:
        """When a new batch could start: the first lane's predicted end of work."""
        return min(self.lanes_free_s)

    def reanchor(self, now_s: float) -> None:
        """What is in flight starts now, in the executor's order, each batch on the lane that frees
        first (one lane: back to back)."""
        lanes = [now_s] * self.spec.lanes
        for b in self.in_flight.values():
            i = lanes.index(min(lanes))
            lanes[i] += b.predicted_exec_s + self.overhead_s
        self.lanes_free_s = lanes

    def has_credit(self, urgent: bool = False, reserved: int = 0) -> bool:
        """A free credit; for an urgent batch also a reserved one, but only when it would overtake a
        queued lower-priority batch: behind the running batch alone it gains nothing by leaving now,
        and a batch bound early is smaller than the one formed at the completion (in the simulator,
        credits = 1, that cost 5% of priority 1 on the bursts)."""
        n = len(self.in_flight)
        if n < self.spec.credits:
            return True
        if not urgent or n >= self.spec.credits + reserved:
            return False
        queued = list(self.in_flight)[self.spec.lanes :]  # the first `lanes` in flight are running
        return any(bid not in self.urgent for bid in queued)

    def start_s(self, now_s: float, urgent: bool) -> float:
        """Predicted start of a new batch: after all in-flight work, or for an urgent batch after the
        running batch and the urgent ones queued (the executor runs urgent batches first)."""
        end = max(now_s, self.free_at_s)
        lanes = self.spec.lanes
        if not urgent or len(self.in_flight) <= lanes:
            return end
        queued = list(self.in_flight.values())[lanes:]  # the first `lanes` in flight are running
        overtaken = sum(b.predicted_exec_s + self.overhead_s for b in queued if b.batch_id not in self.urgent)
        return max(now_s, end - overtaken / lanes)  # the queued work it overtakes was spread on the lanes

    def lane_starts(self, now_s: float, urgent: bool) -> list[float]:
        """Predicted start of a new batch on each lane (``start_s`` on the one that frees first)."""
        first = self.lanes_free_s.index(self.free_at_s)
        return [
            self.start_s(now_s, urgent) if i == first else max(now_s, t)
            for i, t in enumerate(self.lanes_free_s)
        ]


@dataclass(frozen=True)
class Placement:
    """Where the next batch of a model would go, and when it would run."""

    executor_id: str
    device: str
    cap: int  # min(policy cap, executor max batch): a full batch on this executor
    size: int  # min(queue depth, cap)
    start_s: float  # predicted start: max(now, end of in-flight work)
    finish_s: float
    idle: bool  # the executor's in-flight work ends within the dispatch lead: it would idle otherwise
    # When a batch for this busy executor would leave to arrive as it frees up: start minus the lead
    # (the configured dispatch lead, or the executor's learned per-batch round trip if longer). Late
    # binding (SchedulerConfig.late_binding) releases a full batch then rather than at once.
    bind_s: float = 0.0


class ExecutorPool:
    """Registry and flow control of executors. Owned by one ``SchedulerCore``; single-threaded."""

    def __init__(self, reserved_credits: int = 0) -> None:
        self._executors: dict[str, _Executor] = {}
        self.reserved_credits = reserved_credits  # extra in-flight batches per executor, urgent only

    def register(self, spec: ExecutorSpec) -> None:
        """Add an executor, or update a re-registering one's capacity (its in-flight batches stay)."""
        current = self._executors.get(spec.executor_id)
        if current is None:
            self._executors[spec.executor_id] = _Executor(spec)
        elif current.spec.lanes != spec.lanes:  # its in-flight work spread on the new lanes
            current.spec = spec
            current.reanchor(current.free_at_s)
        else:
            current.spec = spec

    def remove(self, executor_id: str) -> list[Batch]:
        """Forget an executor; returns its in-flight batches (oldest first) for re-dispatch."""
        ex = self._executors.pop(executor_id, None)
        return list(ex.in_flight.values()) if ex else []

    def __contains__(self, executor_id: object) -> bool:
        return executor_id in self._executors

    def specs(self) -> list[ExecutorSpec]:
        return [ex.spec for ex in self._executors.values()]

    def max_batch(self, model: str) -> int:
        """Largest batch any executor of ``model`` accepts (0 when none loads it)."""
        return max((ex.spec.max_batch for ex in self._hosts(model)), default=0)

    def in_flight(self, executor_id: str) -> list[Batch]:
        ex = self._executors.get(executor_id)
        return list(ex.in_flight.values()) if ex else []

    def free_at_s(self, executor_id: str) -> float:
        return self._executors[executor_id].free_at_s

    def work_ahead_s(self, executor_id: str, now_s: float) -> float:
        """Predicted execution still ahead on the executor (0 when nothing is in flight)."""
        ex = self._executors.get(executor_id)
        if ex is None or not ex.in_flight:
            return 0.0
        return sum(max(0.0, t - now_s) for t in ex.lanes_free_s)

    def idle_host(self, model: str) -> str | None:
        """An executor of ``model`` with a lane that runs nothing (one lane: nothing in flight), or None."""
        return next(
            (ex.spec.executor_id for ex in self._hosts(model) if len(ex.in_flight) < ex.spec.lanes), None
        )

    def _hosts(self, model: str) -> list[_Executor]:
        return [ex for ex in self._executors.values() if model in ex.spec.models]

    def place(
        self,
        model: str,
        depth: int,
        cap: int,
        predict: Predictor,
        now_s: float,
        lead_s: float,
        urgent: bool = False,
    ) -> Placement | None:
        """Least predicted finish among executors of ``model`` with a free credit (an ``urgent`` batch
        may also take a reserved one); None if none has one. Ties go to the executor with the fewest
        batches in flight, then to the first by id: a laned executor's second lane ties with another
        executor's idle first lane, and each executor is its own process, so spreading first keeps
        two batches' host work off one interpreter (at c16 on the H200 the earliest of six executors
        took 5x the batches of the last)."""
        best: Placement | None = None
        best_key: tuple[float, int, str] | None = None
        for ex in self._hosts(model):
            if not ex.has_credit(urgent, self.reserved_credits):
                continue
            full = max(1, min(cap, ex.spec.max_batch))
            size = min(depth, full)
            start = ex.start_s(now_s, urgent)
            finish = start + predict(ex.spec.device, size)
            key = (finish, len(ex.in_flight), ex.spec.executor_id)
            if best_key is None or key < best_key:
                idle = start <= now_s + lead_s
                best_key = key
                bind = start - max(lead_s, ex.overhead_s)
                best = Placement(ex.spec.executor_id, ex.spec.device, full, size, start, finish, idle, bind)
        return best

    def assign(self, batch: Batch, now_s: float, urgent: bool = False) -> None:
        ex = self._executors[batch.executor_id]
        assert ex.has_credit(urgent, self.reserved_credits), (
            f"executor {batch.executor_id} has no credit for batch {batch.batch_id}"
        )
        assert batch.batch_id not in ex.in_flight
        if not ex.in_flight:
            ex.alone.add(batch.batch_id)
        ex.in_flight[batch.batch_id] = batch
        if urgent:
            ex.urgent.add(batch.batch_id)
        i = ex.lanes_free_s.index(ex.free_at_s)  # the lane that frees first takes it
        ex.lanes_free_s[i] = max(ex.lanes_free_s[i], now_s) + batch.predicted_exec_s + ex.overhead_s

    def complete(
        self, batch_id: int, executor_id: str, now_s: float, exec_s: float | None = None
    ) -> Batch | None:
        """Release the credit of a finished (or failed) batch; None if the pool does not know it there.
        ``exec_s``, the executor's own time for it, teaches the per-batch overhead."""
        ex = self._executors.get(executor_id)
        if ex is None or batch_id not in ex.in_flight:
            return None
        batch = ex.in_flight.pop(batch_id)
        ex.urgent.discard(batch_id)
        if batch_id in ex.alone:
            ex.alone.discard(batch_id)
            if exec_s is not None:
                sample = max(0.0, now_s - batch.formed_s - exec_s)
                ex.overhead_s += _OVERHEAD_GAIN * (sample - ex.overhead_s)
        # What remains starts now (in the executor's order: urgent first, then as sent).
        ex.reanchor(now_s)
        return batch

    def overhead_s(self, executor_id: str) -> float:
        """Learned per-batch time besides execution on this executor (0 before any batch)."""
        ex = self._executors.get(executor_id)
        return ex.overhead_s if ex else 0.0

    def earliest_finish(self, model: str, size: int, predict: Predictor, now_s: float) -> float:
        """Earliest predicted finish of a batch of ``size`` of ``model`` queued behind in-flight work."""
        return min(
            (max(now_s, ex.free_at_s) + predict(ex.spec.device, size) for ex in self._hosts(model)),
            default=float("inf"),
        )

    def predict_finish(
        self, model: str, position: int, cap: int, predict: Predictor, now_s: float, urgent: bool = False
    ) -> float:
        """When the request at 1-based ``position`` of the model's queue would finish if the queue were
        drained in order, in batches of ``cap``, each onto the executor that finishes it first.
        Exact for the first 256 batches, then a fluid estimate at the pool's full-batch rate.
        ``urgent``: the batches are urgent ones (led by top-priority work), which the executor runs
        before its queued lower-priority batches, so each executor is ready when its running batch and
        its queued urgent ones end (``_Executor.start_s``), as dispatch predicts them. Each lane of an
        executor counts as one server."""
        hosts = [(ex, ready) for ex in self._hosts(model) for ready in ex.lane_starts(now_s, urgent)]
        if not hosts:
            return float("inf")
        caps = [max(1, min(cap, ex.spec.max_batch)) for ex, _ in hosts]
        full = [predict(ex.spec.device, c) for (ex, _), c in zip(hosts, caps, strict=True)]
        ready = [r for _, r in hosts]
        remaining = position
        if len(hosts) == 1:  # the loop below in closed form: admission runs this per arrival (#19)
            full_batches = (remaining - 1) // caps[0] if remaining > 0 else 0
            if full_batches < 256:
                rest = remaining - full_batches * caps[0]
                return ready[0] + full_batches * full[0] + predict(hosts[0][0].spec.device, rest)
            rate = caps[0] / full[0] if full[0] > 0 else 0.0
            after = ready[0] + 256 * full[0]
            return after + ((remaining - 256 * caps[0]) / rate if rate > 0 else float("inf"))
        for _ in range(256):
            if remaining <= max(caps):
                return min(
                    ready[j] + predict(ex.spec.device, remaining)
                    for j, (ex, _) in enumerate(hosts)
                    if caps[j] >= remaining
                )
            i = min(range(len(hosts)), key=lambda j: ready[j] + full[j])
            ready[i] += full[i]
            remaining -= caps[i]
        rate = sum(c / f for c, f in zip(caps, full, strict=True) if f > 0)
        return min(ready) + (remaining / rate if rate > 0 else float("inf"))
