"""SchedulerCore end to end with an injected clock: release triggers, shedding, dispatch, re-dispatch,
exactly-once. Predictions are exact: the prior is t(B) = 4 ms + 1 ms x B and no batch reports back
unless a test says so."""

from __future__ import annotations

import pytest

from anvil_scheduler.core import (
    Admission,
    AdmitOutcome,
    EdfPidPolicy,
    ExecutorSpec,
    ProfilePrior,
    RequestState,
    SchedulerConfig,
    SchedulerCore,
    ShedReason,
)

PRIOR = ProfilePrior(base_us=4000, per_item_us=1000)


def make_core(
    executors: tuple[tuple[str, str, int], ...] = (("e0", "gpu", 2),), max_batch: int = 32, **cfg: object
) -> SchedulerCore:
    cfg = {"slack_guard_us": 1000, "slack_guard_fraction": 0.0, "dispatch_lead_us": 0} | cfg
    core = SchedulerCore(EdfPidPolicy(), SchedulerConfig(**cfg), PRIOR)  # type: ignore[arg-type]
    core.register_model("m", max_batch)
    for eid, device, credits in executors:
        core.register_executor(ExecutorSpec(eid, device, max_batch, frozenset({"m"}), credits), 0.0)
    return core


def admit(
    core: SchedulerCore, rid: str, priority: int, now: float, timeout: float | None = None
) -> Admission:
    return core.admit(core.new_request(rid, "m", priority, now, timeout_s=timeout), now)


def fill(core: SchedulerCore, n: int, now: float, priority: int = 3, prefix: str = "f") -> None:
    for i in range(n):
        assert admit(core, f"{prefix}{i}", priority, now).outcome is AdmitOutcome.QUEUED


# ---- release triggers ---------------------------------------------------------------------------
def test_work_conserving_release_to_an_idle_executor() -> None:
    core = make_core()
    admit(core, "a", 3, 0.0)  # 2 s of slack: nothing but the idle executor says "go"
    dec = core.poll(0.0)
    assert [b.request_ids for b in dec.batches] == [["a"]]
    assert dec.batches[0].executor_id == "e0"
    assert dec.batches[0].requests[0].state is RequestState.EXECUTING


def test_size_triggered_release_at_b_star_to_a_busy_executor() -> None:
    core = make_core(max_batch=4)  # B* starts at the model's max batch: 4
    fill(core, 4, 0.0, prefix="busy")
    assert len(core.poll(0.0).batches) == 1  # e0 now runs 4 requests until t = 8 ms (1 credit left)
    fill(core, 3, 0.001)
    assert core.poll(0.001).batches == ()  # 3 < B*, executor busy, plenty of slack: wait
    fill(core, 1, 0.002, prefix="g")
    dec = core.poll(0.002)
    assert [b.size for b in dec.batches] == [4]  # reached B*: leaves at once on the free credit
    assert core.target_batch("m") == 4


def test_late_binding_holds_a_full_batch_until_the_busy_executor_frees_up() -> None:
    """ANVIL_LATE_BINDING: the full batch of batch-class work that would take e0's free credit at once
    waits in the scheduler until e0's running batch is about to end; a priority-1 request arriving
    meanwhile leads a batch that leaves at once, with that work behind it in the batch (bound at
    once, the batch-class batch would have been queued at e0 ahead of it)."""
    core = make_core(max_batch=4, late_binding=True)
    fill(core, 4, 0.0, prefix="busy")
    assert len(core.poll(0.0).batches) == 1  # e0 runs 4 requests until t = 8 ms (1 credit left)
    fill(core, 4, 0.001)
    dec = core.poll(0.001)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(0.008)  # lead 0, no overhead learned
    assert admit(core, "p1", 1, 0.002).outcome is AdmitOutcome.QUEUED
    (batch,) = core.poll(0.002).batches
    assert batch.request_ids[0] == "p1" and batch.size == 4
    assert core.queue_depth() == {("m", 3): 1}


def test_slack_triggered_release_before_b_star() -> None:
    core = make_core()
    fill(core, 20, 0.0, prefix="busy")
    core.poll(0.0)  # e0 busy until 4 + 20 = 24 ms; one credit left
    # Head: deadline 32 ms. Alone it would finish at 24 + 5 = 29 ms: 3 ms of slack, more than the guard.
    admit(core, "head", 2, 0.001, timeout=0.031)
    assert core.poll(0.001).batches == ()
    admit(core, "b", 2, 0.002)
    assert core.poll(0.002).batches == ()  # batch of 2: 24 + 6 -> 2 ms of slack, still waits
    admit(core, "c", 2, 0.003)
    assert core.poll(0.003).batches == ()  # batch of 3: 1 ms of slack == guard
    admit(core, "d", 2, 0.004)
    dec = core.poll(0.004)  # batch of 4 would end at 32 ms: slack 0 < guard -> release now
    assert len(dec.batches) == 1
    batch = dec.batches[0]
    assert batch.request_ids[0] == "head"
    assert batch.size == 3  # shrunk so that the head still meets its deadline with the guard
    assert core.queue_depth() == {("m", 2): 1}


def test_next_wakeup_answers_a_head_that_turns_hopeless() -> None:
    core = make_core(executors=(("e0", "gpu", 1),))
    fill(core, 30, 0.0, prefix="busy")
    core.poll(0.0)  # e0 busy until 34 ms, no credit left
    admit(core, "x", 2, 0.001, timeout=0.05)  # deadline 51 ms; alone it needs 5 ms
    dec = core.poll(0.001)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(0.046)
    dec = core.poll(dec.next_wakeup_s)  # the executor never reported: x can no longer finish in time
    assert [(s.request.request_id, s.reason) for s in dec.shed] == [("x", ShedReason.DEADLINE)]


# ---- shedding -----------------------------------------------------------------------------------
def test_infeasible_even_alone_is_shed_at_admission_with_deadline() -> None:
    core = make_core()
    admit(core, "busy", 3, 0.0)
    assert len(core.poll(0.0).batches) == 1  # the executor is not idle: no probe (see test_core_lockout)
    adm = admit(core, "t", 1, 0.0, timeout=0.004)  # a batch of one takes 5 ms
    assert adm.outcome is AdmitOutcome.SHED
    assert [(s.request.request_id, s.reason) for s in adm.shed] == [("t", ShedReason.DEADLINE)]
    assert adm.shed[0].request.state is RequestState.SHED
    assert core.sheds.counts[(ShedReason.DEADLINE, 1)] == 1
    assert core.poll(0.0).batches == ()  # never executed


def test_queue_bound_evicts_lowest_priority_latest_deadline_first() -> None:
    core = make_core(executors=(), max_queue_depth=3)
    admit(core, "p3-early", 3, 0.0)
    admit(core, "p3-late", 3, 0.1)
    admit(core, "p2", 2, 0.1)
    adm = admit(core, "p1", 1, 0.2)
    assert adm.outcome is AdmitOutcome.QUEUED
    assert [(s.request.request_id, s.reason) for s in adm.shed] == [("p3-late", ShedReason.OVERLOAD)]
    adm = admit(core, "p3-new", 3, 0.2)  # nothing of lower priority to evict: the newcomer goes
    assert adm.outcome is AdmitOutcome.SHED and adm.shed[0].reason is ShedReason.OVERLOAD
    adm = admit(core, "p2-new", 2, 0.2)
    assert [s.request.request_id for s in adm.shed] == ["p3-early"]
    assert core.queue_depth() == {("m", 1): 1, ("m", 2): 2}


def test_work_ahead_overload_evicts_lower_priorities_ahead_of_a_newcomer() -> None:
    core = make_core(executors=(("e0", "gpu", 1),))
    fill(core, 40, 0.0, priority=2, prefix="p2-")  # deadline 200 ms; not polled: all still queued
    for i in range(30):  # batch-class requests with a tight timeout sit ahead of the newcomer
        admit(core, f"p3t-{i}", 3, 0.0, timeout=0.19)
    adm = admit(core, "p1", 1, 0.15)  # deadline 200 ms, behind 70 requests: 32 + 32 + 7 cannot make it
    assert adm.outcome is AdmitOutcome.QUEUED
    assert all(s.reason is ShedReason.OVERLOAD for s in adm.shed)
    # Lowest priority first, latest deadline first, and only as many as needed: behind 40 p2 the p1
    # finishes at 150 + 36 + 13 = 199 ms (+1 ms guard), so all 30 batch-class requests go, no p2 does.
    assert sorted(s.request.request_id for s in adm.shed) == sorted(f"p3t-{i}" for i in range(30))
    first = core.poll(0.15).batches[0]
    core.on_batch_done(first.batch_id, "e0", 0.036, 0.186)
    second = core.poll(0.186).batches[0]
    assert "p1" in second.request_ids
    done = core.on_batch_done(second.batch_id, "e0", 0.013, 0.199)
    assert [r.deadline_s >= 0.199 for r in done.answered] == [True] * second.size


def test_newcomer_that_no_eviction_can_help_is_shed_with_overload() -> None:
    core = make_core(executors=(("e0", "gpu", 1),))
    fill(core, 20, 0.0, priority=1, prefix="p1-")
    core.poll(0.0)  # e0 busy until 24 ms
    adm = admit(core, "p3", 3, 0.0, timeout=0.029)  # alone: 5 ms, fine; behind e0: 29 ms + 1 ms guard
    assert adm.outcome is AdmitOutcome.SHED and adm.shed[0].reason is ShedReason.OVERLOAD


# ---- dispatch -----------------------------------------------------------------------------------
def test_dispatch_picks_least_predicted_finish() -> None:
    core = make_core(executors=(("fast", "h200", 2), ("slow", "cpu", 2)))
    core.profiles.get("m", "cpu").load_us({1: 50_000, 8: 120_000}, weight=100)
    admit(core, "a", 2, 0.0)
    assert core.poll(0.0).batches[0].executor_id == "fast"  # 5 ms beats 50 ms


def test_dispatch_spreads_to_the_executor_that_finishes_first() -> None:
    core = make_core(executors=(("e0", "gpu", 2), ("e1", "gpu", 2)))
    fill(core, 16, 0.0, prefix="a")
    first = core.poll(0.0).batches
    fill(core, 1, 0.001, prefix="b")
    second = core.poll(0.001).batches
    assert [b.executor_id for b in first + second] == ["e0", "e1"]


def test_credits_bound_in_flight_batches() -> None:
    core = make_core(executors=(("e0", "gpu", 1),))
    admit(core, "a", 3, 0.0)
    dec = core.poll(0.0)
    admit(core, "b", 3, 0.001)
    assert core.poll(0.001).batches == ()  # the only credit is taken
    done = core.on_batch_done(dec.batches[0].batch_id, "e0", 0.005, 0.005)
    assert [r.request_id for r in done.answered] == ["a"]
    assert [b.request_ids for b in core.poll(0.005).batches] == [["b"]]


def test_completion_feeds_the_profile_and_slo_tracker() -> None:
    core = make_core()
    for i, now in enumerate((0.0, 0.01)):
        admit(core, f"r{i}", 1, now)
        batch = core.poll(now).batches[0]
        core.on_batch_done(batch.batch_id, "e0", 0.002, now + 0.002)
    # the first batch of a size on an executor is warm-up: not a sample
    assert core.profiles.get("m", "gpu").samples(1) == 1
    assert core.slo.attainment(1, 0.012) == 1.0
    assert list(core.batch_sizes["m"]) == [(0.0, 1), (0.01, 1)]


# ---- executor loss and exactly-once -------------------------------------------------------------
def test_executor_loss_requeues_in_flight_requests_at_original_deadlines() -> None:
    core = make_core(executors=(("e0", "gpu", 1), ("e1", "gpu", 1)))
    admit(core, "a", 2, 0.0)
    admit(core, "tight", 1, 0.0, timeout=0.012)
    lost = core.poll(0.0).batches[0]
    assert lost.executor_id == "e0" and set(lost.request_ids) == {"a", "tight"}
    rel = core.on_executor_lost("e0", 0.008)
    assert [r.request_id for r in rel.requeued] == ["a"]
    assert rel.requeued[0].deadline_s == pytest.approx(0.2) and rel.requeued[0].state is RequestState.QUEUED
    assert [(s.request.request_id, s.reason) for s in rel.shed] == [("tight", ShedReason.DEADLINE)]
    again = core.poll(0.008).batches
    assert [(b.executor_id, b.request_ids) for b in again] == [("e1", ["a"])]


def test_exactly_once_duplicates_and_late_results() -> None:
    core = make_core(executors=(("e0", "gpu", 1), ("e1", "gpu", 1)))
    assert admit(core, "a", 2, 0.0).outcome is AdmitOutcome.QUEUED
    assert admit(core, "a", 2, 0.0).outcome is AdmitOutcome.DUPLICATE
    assert core.ledger.duplicates_rejected == 1
    old = core.poll(0.0).batches[0]
    core.on_executor_lost(old.executor_id, 0.001)
    new = core.poll(0.001).batches[0]
    assert new.executor_id != old.executor_id and new.requests[0].attempts == 2
    late = core.on_batch_done(old.batch_id, old.executor_id, 0.005, 0.005)  # the "dead" one answers
    assert late.answered == () and late.late == ("a",)
    assert core.ledger.late_results_dropped == 1
    done = core.on_batch_done(new.batch_id, new.executor_id, 0.005, 0.006)
    assert [r.request_id for r in done.answered] == ["a"]
    assert core.on_batch_done(new.batch_id, new.executor_id, 0.005, 0.007).answered == ()
    assert admit(core, "a", 2, 0.008).outcome is AdmitOutcome.DUPLICATE  # answered ids are remembered
    assert core.ledger.open_count == 0


def test_failed_batch_retries_then_answers_every_request_with_the_error() -> None:
    core = make_core(max_attempts=2)
    admit(core, "a", 3, 0.0)
    admit(core, "b", 3, 0.0)
    b1 = core.poll(0.0).batches[0]
    rel = core.on_batch_failed(b1.batch_id, "e0", 0.01)
    assert {r.request_id for r in rel.requeued} == {"a", "b"}
    b2 = core.poll(0.01).batches[0]
    rel = core.on_batch_failed(b2.batch_id, "e0", 0.02)
    assert {r.request_id for r in rel.failed} == {"a", "b"}
    assert all(r.state is RequestState.FAILED for r in rel.failed)
    assert core.ledger.open_count == 0


def test_unknown_model_is_rejected_with_the_known_ones() -> None:
    core = make_core()
    req = core.new_request("x", "other", 1, 0.0)
    with pytest.raises(ValueError, match=r"unknown model 'other'; registered: \['m'\]"):
        core.admit(req, 0.0)
