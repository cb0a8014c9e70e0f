"""Idle means zero: whichever way a request leaves the core (answered, shed at admission or in the
queue, evicted, failed, re-dispatched after an executor loss, duplicate submission, duplicate or late
result), queue, in-flight and open-request state return to zero once nothing is outstanding."""

from __future__ import annotations

import pytest

from anvil_scheduler.core import (
    AdmitOutcome,
    BatchingPolicy,
    EdfPidPolicy,
    ExecutorSpec,
    FixedDelayPolicy,
    ProfilePrior,
    SchedulerConfig,
    SchedulerCore,
)

PRIOR = ProfilePrior(base_us=4000, per_item_us=1000)


def make_core(
    credits: int = 2,
    executors: tuple[str, ...] = ("e0",),
    policy: BatchingPolicy | None = None,
    **cfg: object,
) -> SchedulerCore:
    cfg = {"slack_guard_us": 1000, "slack_guard_fraction": 0.0, "dispatch_lead_us": 0} | cfg
    core = SchedulerCore(policy or EdfPidPolicy(), SchedulerConfig(**cfg), PRIOR)  # type: ignore[arg-type]
    core.register_model("m", 8)
    for eid in executors:
        core.register_executor(ExecutorSpec(eid, "gpu", 8, frozenset({"m"}), credits), 0.0)
    return core


def admit(
    core: SchedulerCore, rid: str, priority: int, now: float, timeout: float | None = None
) -> AdmitOutcome:
    return core.admit(core.new_request(rid, "m", priority, now, timeout_s=timeout), now).outcome


def test_answered() -> None:
    core = make_core()
    admit(core, "a", 2, 0.0)
    (b,) = core.poll(0.0).batches
    assert core.idle_violations(0.0) != []  # busy is not idle: the helper can fail
    assert core.accounting(0.0).in_flight_requests == 1 and core.accounting(0.0).work_ahead_s > 0
    core.on_batch_done(b.batch_id, "e0", 0.005, 0.005)
    assert core.idle_violations(0.005) == []


def test_shed_at_admission_in_the_queue_and_by_eviction() -> None:
    core = make_core(credits=1, max_queue_depth=2, reserved_credits=0)  # e0 busy: no credit at all
    admit(core, "run", 3, 0.0)
    (b,) = core.poll(0.0).batches  # e0 busy: everything else waits
    assert admit(core, "hopeless", 1, 0.0, timeout=0.001) is AdmitOutcome.SHED
    assert admit(core, "q1", 3, 0.0) is AdmitOutcome.QUEUED
    assert admit(core, "tight", 2, 0.0, timeout=0.012) is AdmitOutcome.QUEUED
    assert admit(core, "evictor", 1, 0.0) is AdmitOutcome.QUEUED  # queue bound: q1 is evicted
    dec = core.poll(0.02)  # "tight" turned hopeless while e0 was busy
    assert {s.request.request_id for s in dec.shed} == {"tight"}
    core.on_batch_done(b.batch_id, "e0", 0.02, 0.02)
    (b2,) = core.poll(0.02).batches
    core.on_batch_done(b2.batch_id, "e0", 0.005, 0.025)
    assert core.idle_violations(0.025) == []


def test_executor_lost_then_served_elsewhere_or_failed() -> None:
    core = make_core(credits=1, executors=("e0", "e1"))
    admit(core, "a", 3, 0.0)
    admit(core, "b", 3, 0.0)
    batches = core.poll(0.0).batches
    assert len(batches) == 1
    rel = core.on_executor_lost(batches[0].executor_id, 0.001)  # re-queued, attempts 1 of 2
    assert len(rel.requeued) == 2
    (again,) = core.poll(0.001).batches
    rel2 = core.on_executor_lost(again.executor_id, 0.002)  # out of attempts: failed
    assert len(rel2.failed) == 2
    assert core.idle_violations(0.002) == []


def test_failed_batch_duplicate_submission_and_late_results() -> None:
    core = make_core()
    admit(core, "a", 3, 0.0)
    assert admit(core, "a", 3, 0.0) is AdmitOutcome.DUPLICATE
    (b,) = core.poll(0.0).batches
    rel = core.on_batch_failed(b.batch_id, "e0", 0.001, retryable=False)
    assert [r.request_id for r in rel.failed] == ["a"]
    late = core.on_batch_done(b.batch_id, "e0", 0.005, 0.005)  # a result after the failure report
    assert late.answered == () and late.late == ("a",)
    admit(core, "c", 3, 0.01)
    (c,) = core.poll(0.01).batches
    core.on_batch_done(c.batch_id, "e0", 0.005, 0.015)
    dup = core.on_batch_done(c.batch_id, "e0", 0.005, 0.016)  # the same result twice
    assert dup.answered == ()
    assert core.idle_violations(0.016) == []


@pytest.mark.parametrize("policy", [EdfPidPolicy, FixedDelayPolicy])
def test_queued_work_of_a_model_whose_executors_are_gone_is_answered_at_its_deadline(
    policy: type[BatchingPolicy],
) -> None:
    core = make_core(credits=1, policy=policy())
    admit(core, "run", 3, 0.0)
    core.poll(0.0)
    admit(core, "waits", 3, 0.0)
    core.on_executor_lost("e0", 0.001)
    dec = core.poll(2.5)
    assert {s.request.request_id for s in dec.shed} == {"run", "waits"}
    assert core.idle_violations(2.5) == []
