"""Priority holds at the executor link (#19): an urgent batch (one with top-priority work) may take a
reserved credit, is predicted to start after the running batch only (the executor runs it first), and
lower-priority batches never touch the reserve. Predictions are exact: t(B) = 4 ms + 1 ms x B."""

from __future__ import annotations

from anvil_scheduler.core import (
    AdmitOutcome,
    EdfPidPolicy,
    ExecutorSpec,
    ProfilePrior,
    SchedulerConfig,
    SchedulerCore,
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
