"""The two peer policies behind BatchingPolicy (Triton-style fixed delay, Clipper-style AIMD) and the
EDF+PID policy's own feedback: each is a thin subclass over the same core."""

from __future__ import annotations

import pytest

from anvil_scheduler.core import (
    AdmitOutcome,
    AimdConfig,
    AimdPolicy,
    BatchingPolicy,
    EdfPidPolicy,
    ExecutorSpec,
    FixedDelayConfig,
    FixedDelayPolicy,
    ProfilePrior,
    QueueOrder,
    SchedulerConfig,
    SchedulerCore,
)


def make_core(policy: BatchingPolicy, credits: int = 1, max_batch: int = 32) -> SchedulerCore:
    cfg = SchedulerConfig(slack_guard_us=1000, slack_guard_fraction=0.0, dispatch_lead_us=0)
    core = SchedulerCore(policy, cfg, ProfilePrior(base_us=4000, per_item_us=1000))
    core.register_model("m", max_batch)
    core.register_executor(ExecutorSpec("e0", "gpu", max_batch, frozenset({"m"}), credits), 0.0)
    return core


def admit(
    core: SchedulerCore, rid: str, priority: int, now: float, timeout: float | None = None
) -> AdmitOutcome:
    return core.admit(core.new_request(rid, "m", priority, now, timeout_s=timeout), now).outcome


def test_fixed_delay_waits_for_the_oldest_request_then_releases() -> None:
    core = make_core(FixedDelayPolicy(FixedDelayConfig(max_batch=8, max_queue_delay_us=5000)))
    admit(core, "a", 2, 0.000)
    dec = core.poll(0.000)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(0.005)  # idle executor, still waits
    admit(core, "b", 1, 0.002)
    assert core.poll(0.002).batches == ()
    dec = core.poll(0.005)
    assert [b.request_ids for b in dec.batches] == [["a", "b"]]  # FIFO, not by deadline


def test_fixed_delay_releases_a_full_batch_at_once() -> None:
    core = make_core(FixedDelayPolicy(FixedDelayConfig(max_batch=4, max_queue_delay_us=100_000)))
    for i in range(4):
        admit(core, f"r{i}", 3, 0.001 * i)
    assert [b.size for b in core.poll(0.003).batches] == [4]


def test_peers_never_shed_and_run_late_work_late() -> None:
    core = make_core(FixedDelayPolicy(FixedDelayConfig(max_batch=8, max_queue_delay_us=0)))
    assert FixedDelayPolicy.order is QueueOrder.ARRIVAL and not FixedDelayPolicy.sheds
    assert admit(core, "hopeless", 1, 0.0, timeout=0.001) is AdmitOutcome.QUEUED  # 5 ms to run, 1 ms left
    batch = core.poll(0.0).batches[0]
    done = core.on_batch_done(batch.batch_id, "e0", 0.005, 0.005)
    assert [r.request_id for r in done.answered] == ["hopeless"]
    assert core.slo.attainment(1, 0.005) == 0.0  # answered late: a miss, not a shed
    assert core.sheds.total() == 0


def test_aimd_is_work_conserving_and_adapts_its_cap() -> None:
    policy = AimdPolicy(AimdConfig(initial_batch=2, additive_step=1, backoff=0.5, slo_fraction=1.0))
    core = make_core(policy)
    for i in range(10):
        admit(core, f"r{i}", 2, 0.0)
    b1 = core.poll(0.0).batches[0]
    assert b1.size == 2  # the cap, sent at once to the idle executor
    core.on_batch_done(b1.batch_id, "e0", 0.006, 0.006)  # 6 ms <= 200 ms objective: +1
    assert policy.batch_limit("m") == 3
    b2 = core.poll(0.006).batches[0]
    assert b2.size == 3
    core.on_batch_done(b2.batch_id, "e0", 0.250, 0.256)  # over the objective: x(1 - 0.5)
    assert policy.batch_limit("m") == 1


def test_aimd_cap_never_exceeds_the_model_max_batch() -> None:
    policy = AimdPolicy(AimdConfig(initial_batch=4, additive_step=8))
    core = make_core(policy, max_batch=6)
    assert policy.batch_limit("m") == 4
    for i in range(3):
        admit(core, f"r{i}", 3, 0.0)
    b = core.poll(0.0).batches[0]
    core.on_batch_done(b.batch_id, "e0", 0.001, 0.001)
    assert policy.batch_limit("m") == 6


def test_edf_pid_shrinks_b_star_when_arrivals_wait_behind_long_batches() -> None:
    policy = EdfPidPolicy()
    core = make_core(policy)
    assert core.target_batch("m") == 32
    running = None  # (batch, end time): the executor runs one batch at a time
    for ms in range(3000):  # 1,000 batch-class req/s keep full batches running; 1 in 10 is interactive
        t = ms / 1000
        if running and running[1] <= t:
            core.on_batch_done(running[0].batch_id, "e0", running[0].predicted_exec_s, running[1])
            running = None
        admit(core, f"r{ms}", 1 if ms % 10 == 0 else 3, t)
        for b in core.poll(t).batches:
            running = (b, t + b.predicted_exec_s)
    assert policy.measured("m") is not None
    assert core.target_batch("m") < 32  # p1 arrivals saw more than 65% of 50 ms of blocking


def test_edf_pid_ceiling_bounds_b_star_by_the_tightest_class() -> None:
    policy = EdfPidPolicy()
    core = make_core(policy, max_batch=64)
    for i, t in enumerate((0.0, 0.06, 0.12)):
        admit(core, f"r{i}", 1, t)
    # 85% of 50 ms minus a batch of one (5 ms) leaves 37.5 ms: 4 + 1 x 33 = 37 ms -> 33 requests
    assert policy.ceiling("m") == 33
    assert core.target_batch("m") <= 33
