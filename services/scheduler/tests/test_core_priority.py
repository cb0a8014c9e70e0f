"""Priority holds at the executor link (#19): an urgent batch (one with top-priority work) may take a
reserved credit, is predicted to start after the running batch only (the executor runs it first), and
lower-priority batches never touch the reserve. Predictions are exact: t(B) = 4 ms + 1 ms x B."""

from __future__ import annotations

from anvil_scheduler.core import (
    Admission,
    AdmitOutcome,
    EdfPidPolicy,
    ExecutorSpec,
    PriorityClass,
    ProfilePrior,
    SchedulerConfig,
    SchedulerCore,
    ShedReason,
)

PRIOR = ProfilePrior(base_us=4000, per_item_us=1000)


def make_core(reserved: int, credits: int = 2, max_batch: int = 8) -> SchedulerCore:
    cfg = SchedulerConfig(
        slack_guard_us=1000, slack_guard_fraction=0.0, dispatch_lead_us=0, reserved_credits=reserved
    )
    core = SchedulerCore(EdfPidPolicy(), cfg, PRIOR)
    core.register_model("m", max_batch)
    core.register_executor(ExecutorSpec("e0", "gpu", max_batch, frozenset({"m"}), credits), 0.0)
    return core


def admit(core: SchedulerCore, rid: str, priority: int, now: float) -> AdmitOutcome:
    return core.admit(core.new_request(rid, "m", priority, now), now).outcome


def busy_with_batch_class(core: SchedulerCore) -> None:
    """Both credits held by full batches of priority 3 (each 12 ms: e0 busy until t = 24 ms)."""
    for i in range(16):
        assert admit(core, f"p3-{i}", 3, 0.0) is AdmitOutcome.QUEUED
    assert [b.size for b in core.poll(0.0).batches] == [8, 8]


def first_p1_batch(core: SchedulerCore, until_s: float) -> float | None:
    """Poll every 0.5 ms (no executor reports back): when the batch carrying "p1" leaves, or None if it
    does not leave by ``until_s``."""
    t = 0.001
    assert admit(core, "p1", 1, t) is AdmitOutcome.QUEUED
    while t <= until_s:
        for b in core.poll(t).batches:
            if "p1" in b.request_ids:
                return t
        t += 0.0005
    return None


def test_priority_1_takes_a_reserved_credit_that_batch_class_work_holds_every_credit_of() -> None:
    reserved, plain = make_core(reserved=1), make_core(reserved=0)
    for core in (reserved, plain):
        busy_with_batch_class(core)
    got = first_p1_batch(reserved, 0.040)
    assert got is not None, "with a reserved credit priority 1 leaves while batch-class work holds both"
    # it leaves when the running batch ends (12 ms: work-conserving), not after the queued one (24 ms)
    assert 0.011 <= got <= 0.0125
    assert first_p1_batch(plain, 0.040) is None  # the same core without the reserve: no credit at all


def test_batch_class_work_never_uses_the_reserved_credit() -> None:
    core = make_core(reserved=1)
    busy_with_batch_class(core)
    for i in range(8):
        admit(core, f"more-{i}", 3, 0.001)
    for k in range(60):  # 30 ms, past both batches' predicted ends: still no report, so no credit
        assert core.poll(0.001 + k * 0.0005).batches == ()


def test_an_urgent_batch_is_predicted_to_start_after_the_running_batch_only() -> None:
    core = make_core(reserved=1)
    busy_with_batch_class(core)  # running: 0-12 ms; queued behind it: 12-24 ms
    predict = core.profiles.predict_s
    plain = core.pool.place("m", 1, 8, lambda d, b: predict("m", d, b), 0.001, 0.0)
    urgent = core.pool.place("m", 1, 8, lambda d, b: predict("m", d, b), 0.001, 0.0, urgent=True)
    assert plain is None  # both credits held
    assert urgent is not None and abs(urgent.start_s - 0.012) < 1e-9


def test_the_reserve_is_not_taken_when_nothing_queued_would_be_overtaken() -> None:
    """Behind the running batch alone an urgent batch gains nothing by leaving early (it would only be
    smaller): with one credit, held by the running batch, priority 1 waits for the completion."""
    core = make_core(reserved=1, credits=1)
    for i in range(8):
        admit(core, f"p3-{i}", 3, 0.0)
    assert [b.size for b in core.poll(0.0).batches] == [8]
    assert first_p1_batch(core, 0.030) is None


def test_the_pool_learns_the_per_batch_overhead_and_counts_it_in_the_work_ahead() -> None:
    """Round trip 5 ms for 1 ms of execution: the 4 ms besides (links, handling) is learned from batches
    sent alone, and an executor is busy until its result can be back, not when execution would end."""
    core = make_core(reserved=1)
    t = 0.0
    for i in range(60):
        admit(core, f"r{i}", 3, t)
        (b,) = core.poll(t).batches
        core.on_batch_done(b.batch_id, "e0", 0.001, t + 0.005)
        t += 0.010
    assert abs(core.pool.overhead_s("e0") - 0.004) < 0.0002
    admit(core, "last", 3, t)
    (b,) = core.poll(t).batches
    assert abs(core.accounting(t).work_ahead_s - (b.predicted_exec_s + core.pool.overhead_s("e0"))) < 1e-9


def test_admission_predicts_priority_1_on_the_urgent_path_and_keeps_what_dispatch_can_serve() -> None:
    """The live stack under a CPU hog (#19): priority 1 was shed as overload while a priority-3 batch
    waited behind the running one, because admission predicted its finish behind *all* in-flight work,
    although dispatch sends it on a reserved credit and the executor runs it before that queued batch.
    SLO 20 ms: behind both batches it would finish at 24 + 5 ms (late); after the running one, 17 ms."""
    classes = (PriorityClass(1, "interactive", 20.0), PriorityClass(3, "batch", 2000.0))
    cfg = SchedulerConfig(
        classes, slack_guard_us=1000, slack_guard_fraction=0.0, dispatch_lead_us=0, reserved_credits=1
    )
    core = SchedulerCore(EdfPidPolicy(), cfg, PRIOR)
    core.register_model("m", 8)
    core.register_executor(ExecutorSpec("e0", "gpu", 8, frozenset({"m"}), 2), 0.0)
    busy_with_batch_class(core)  # running 0-12 ms, queued behind it 12-24 ms
    running, queued = core.pool.in_flight("e0")
    p1 = core.new_request("p1", "m", 1, 0.0)
    admission = core.admit(p1, 0.0)
    assert admission.outcome is AdmitOutcome.QUEUED, [s.reason for s in admission.shed]
    t, sent = 0.0, core.poll(0.0).batches
    while not sent and t < 0.012:  # it leaves by the running batch's end, on the reserved credit
        t = round(t + 0.0005, 4)
        sent = core.poll(t).batches
    (urgent,) = sent
    assert urgent.request_ids == ["p1"]
    # The executor runs the urgent batch right after the running one, ahead of the queued one.
    core.on_batch_done(running.batch_id, "e0", 0.012, 0.012)
    done = core.on_batch_done(urgent.batch_id, "e0", 0.005, 0.017)
    assert [r.request_id for r in done.answered] == ["p1"] and p1.deadline_s >= 0.017
    core.on_batch_done(queued.batch_id, "e0", 0.012, 0.029)
    assert core.idle_violations(0.029) == []


def admit_by(core: SchedulerCore, rid: str, priority: int, now: float, timeout_s: float) -> Admission:
    return core.admit(core.new_request(rid, "m", priority, now, timeout_s=timeout_s), now)


def test_priority_1_predicted_late_but_not_hopeless_is_queued_and_served_if_the_executor_is_faster() -> None:
    """Priority 1 is refused only when hopeless (#19): behind two priority-1 requests and a running
    batch predicted at 24 ms, "c" (deadline 31.5 ms) is predicted to finish at 31 ms + 1 ms guard, which
    the work-ahead test called overload; first in a batch of one it would finish at 29 ms. Queued, it is
    served in time when the running batch ends early, as the profile's tail predicted it would not."""
    core = make_core(reserved=1, credits=1, max_batch=32)
    for i in range(20):
        assert admit(core, f"w{i}", 1, 0.0) is AdmitOutcome.QUEUED
    (running,) = core.poll(0.0).batches  # 4 + 20 ms predicted
    assert admit_by(core, "a", 1, 0.0, 0.030).outcome is AdmitOutcome.QUEUED  # 24 + 5 (+1) ms
    assert admit_by(core, "b", 1, 0.0, 0.030).outcome is AdmitOutcome.QUEUED  # 24 + 6 (+1) ms
    c = admit_by(core, "c", 1, 0.0, 0.0315)
    assert c.outcome is AdmitOutcome.QUEUED, [s.reason for s in c.shed]
    core.on_batch_done(running.batch_id, "e0", 0.010, 0.010)
    (batch,) = core.poll(0.010).batches
    assert batch.request_ids == ["a", "b", "c"]
    done = core.on_batch_done(batch.batch_id, "e0", 0.007, 0.017)
    assert all(r.deadline_s >= 0.017 for r in done.answered) and len(done.answered) == 3


def test_a_priority_1_head_rides_a_smaller_batch_rather_than_being_shed_to_keep_a_batch_full() -> None:
    """Backlog of priority 1 only (a full batch of 2 waits): the head (deadline 12.5 ms) misses in a
    batch of 2 (6 + 6 + 1 ms) but not alone (6 + 5 + 1 ms). It leaves alone; it was shed as overload
    to keep the batch full, the rule for lower priorities (#19)."""
    core = make_core(reserved=1, credits=1, max_batch=2)
    for i in range(2):
        admit(core, f"p3-{i}", 3, 0.0)
    (running,) = core.poll(0.0).batches  # e0 busy until 6 ms
    assert admit_by(core, "h", 1, 0.0, 0.0125).outcome is AdmitOutcome.QUEUED
    assert admit(core, "n", 1, 0.0) is AdmitOutcome.QUEUED
    core.on_batch_done(running.batch_id, "e0", 0.006, 0.006)
    decision = core.poll(0.006)
    assert decision.shed == ()
    assert [b.request_ids for b in decision.batches] == [["h"]]


def test_a_hopeless_priority_1_newcomer_is_shed_as_deadline_not_as_overload() -> None:
    """Priority 1 refused at admission is refused because it is hopeless (first in a batch of one
    after the running batch it would still miss), so its answer says deadline, not "lower priorities
    go first", which would be untrue for the top priority. Running batch predicted 24 ms; alone after
    it 29 ms; deadline 27 ms, although alone on an idle executor it would take 5 ms."""
    core = make_core(reserved=1, credits=1, max_batch=32)
    for i in range(20):
        assert admit(core, f"w{i}", 1, 0.0) is AdmitOutcome.QUEUED
    assert len(core.poll(0.0).batches) == 1  # running until 24 ms
    refused = admit_by(core, "late", 1, 0.0, 0.027)
    assert refused.outcome is AdmitOutcome.SHED
    assert [s.reason for s in refused.shed] == [ShedReason.DEADLINE]
    # A priority-3 newcomer that the same work ahead makes late is shed for overload (lower first).
    p3 = admit_by(core, "p3", 3, 0.0, 0.027)
    assert p3.outcome is AdmitOutcome.SHED and [s.reason for s in p3.shed] == [ShedReason.OVERLOAD]
