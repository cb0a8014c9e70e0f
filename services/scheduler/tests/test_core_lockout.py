"""Issue #22: one slow batch must not lock a priority class of a model out.

Repro with the service's defaults (EDF+PID, default config and prior) and a fake clock: a new model's
first batch takes 300 ms (first touch / compile); the gateway has answered 504 at 200 ms and the core
never hears of it; then one request at a time, 50 ms apart, each batch taking 2 ms. Before the fix the
profile's p90 over <= 10 samples was the outlier while the prior's weight decayed, so the prediction
*rose* with every fast batch (69 -> 184 ms) until priority 2 was shed as overload, then froze: shed
requests produce no observations.
"""

from __future__ import annotations

import pytest

from anvil_scheduler.core import AdmitOutcome, EdfPidPolicy, ExecutorSpec, SchedulerCore

FAST_S, SLOW_S, GAP_S = 0.002, 0.300, 0.050


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, dt: float) -> float:
        self.now += dt
        return self.now


def make_core() -> SchedulerCore:
    core = SchedulerCore(EdfPidPolicy())
    core.register_model("usermlp", max_batch=64)
    core.register_executor(ExecutorSpec("e0", "cpu", 64, frozenset({"usermlp"}), credits=2), 0.0)
    return core


def serve_one(core: SchedulerCore, clock: Clock, rid: str, priority: int, exec_s: float) -> str:
    """Admit one request alone, run its batch for ``exec_s`` and report it; 'served' or why not."""
    now = clock.now
    # the gateway spent 2 ms of the budget before the scheduler saw it
    req = core.new_request(
        rid, "usermlp", priority, now, timeout_s=core.config.priority(priority).slo_ms / 1e3 - 0.002
    )
    adm = core.admit(req, now)
    if adm.outcome is not AdmitOutcome.QUEUED:
        return f"{adm.outcome.value}:{adm.shed[0].reason.value if adm.shed else ''}"
    dec = core.poll(now)
    if dec.shed:
        return f"shed:{dec.shed[0].reason.value}"
    (batch,) = dec.batches
    done = core.on_batch_done(batch.batch_id, "e0", exec_s, clock.advance(exec_s))
    assert [r.request_id for r in done.answered] == [rid]
    core.poll(clock.now)
    return "served"


@pytest.mark.parametrize("priority", [1, 2, 3])
def test_one_slow_first_batch_then_every_sequential_request_is_served(priority: int) -> None:
    core, clock = make_core(), Clock()
    serve_one(core, clock, "first", 2, SLOW_S)  # answered after the gateway's 504: nobody waits for it
    clock.advance(GAP_S)
    outcomes = []
    for i in range(60):
        outcomes.append(serve_one(core, clock, f"r{i}", priority, FAST_S))
        clock.advance(GAP_S)
    assert outcomes == ["served"] * 60, outcomes
    assert core.idle_violations(clock.now) == []


def test_the_first_batch_of_a_size_on_an_executor_is_warm_up_not_a_sample() -> None:
    core, clock = make_core(), Clock()
    serve_one(core, clock, "first", 2, SLOW_S)
    prof = core.profiles.get("usermlp", "cpu")
    assert prof.samples(1) == 0
    serve_one(core, clock, "second", 2, FAST_S)
    assert prof.samples(1) == 1
    core.on_executor_lost("e0", clock.now)  # a new process warms up again
    core.register_executor(ExecutorSpec("e0", "cpu", 64, frozenset({"usermlp"})), clock.now)
    serve_one(core, clock, "third", 2, SLOW_S)
    assert prof.samples(1) == 1


@pytest.mark.parametrize("priority", [1, 2])
def test_a_slow_batch_after_warm_up_locks_nothing_out(priority: int) -> None:
    """The slow batch is a real sample here (the second batch): the prediction may shed for a while,
    but a request alone on an idle executor is never shed as overload, probes run, old samples fade."""
    core, clock = make_core(), Clock()
    serve_one(core, clock, "warm", 2, FAST_S)
    clock.advance(GAP_S)
    serve_one(core, clock, "slow", 2, SLOW_S)
    clock.advance(GAP_S)
    outcomes = []
    for i in range(200):  # 10 s of one request every 50 ms
        outcomes.append(serve_one(core, clock, f"r{i}", priority, FAST_S))
        clock.advance(GAP_S)
    assert "shed:overload" not in outcomes
    # probes (at most one per probe interval) correct the profile; then everything is served
    first_ok = outcomes.index("served")
    assert first_ok * GAP_S <= 2 * core.config.probe_interval_s, outcomes[:first_ok]
    assert outcomes[-100:] == ["served"] * 100, outcomes
    assert core.idle_violations(clock.now) == []


def test_a_request_alone_on_an_idle_executor_is_never_shed_as_overload() -> None:
    core, clock = make_core(), Clock()
    serve_one(core, clock, "warm", 2, FAST_S)
    # a profile that says a batch of one takes 190 ms: alone it fits 198 ms, not with the guard
    core.profiles.get("usermlp", "cpu").load_us({1: 190_000}, weight=1000)
    for i in range(5):
        clock.advance(GAP_S)
        req = core.new_request(f"r{i}", "usermlp", 2, clock.now, timeout_s=0.198)
        assert core.admit(req, clock.now).outcome is AdmitOutcome.QUEUED
        (batch,) = core.poll(clock.now).batches
        core.on_batch_done(batch.batch_id, "e0", 0.190, clock.advance(0.190))
    assert core.sheds.total() == 0


def test_a_hopeless_prediction_is_probed_once_per_interval_alone_on_an_idle_executor() -> None:
    core, clock = make_core(), Clock()
    serve_one(core, clock, "warm", 1, FAST_S)
    core.profiles.get("usermlp", "cpu").load_us({1: 100_000}, weight=1000)  # p1's budget is 50 ms
    clock.advance(GAP_S)
    probe = core.new_request("probe", "usermlp", 1, clock.now)
    assert core.admit(probe, clock.now).outcome is AdmitOutcome.QUEUED and probe.probe
    (batch,) = core.poll(clock.now).batches  # sent, though the profile calls it hopeless
    # while the probe runs the executor is not idle: the next hopeless request is shed, not queued
    other = core.new_request("other", "usermlp", 1, clock.now)
    assert core.admit(other, clock.now).shed[0].reason.value == "deadline"
    core.on_batch_done(batch.batch_id, "e0", FAST_S, clock.advance(FAST_S))
    # within the interval, alone and idle again: still no second probe
    again = core.new_request("again", "usermlp", 1, clock.advance(0.1))
    assert core.admit(again, clock.now).outcome is AdmitOutcome.SHED
    after = core.new_request("after", "usermlp", 1, clock.advance(core.config.probe_interval_s))
    assert core.admit(after, clock.now).outcome is AdmitOutcome.QUEUED and after.probe
    (batch,) = core.poll(clock.now).batches
    core.on_batch_done(batch.batch_id, "e0", FAST_S, clock.advance(FAST_S))
    assert core.idle_violations(clock.now) == []


def test_every_priority_is_served_after_a_slow_batch_in_the_middle() -> None:
    core, clock = make_core(), Clock()
    for i in range(20):  # warm: the model is known to be fast
        serve_one(core, clock, f"w{i}", 2, FAST_S)
        clock.advance(GAP_S)
    serve_one(core, clock, "slow", 3, SLOW_S)  # one hiccup (a GC pause, a page fault storm)
    clock.advance(GAP_S)
    outcomes: dict[int, list[str]] = {p: [] for p in (1, 2, 3)}
    for i in range(30):
        for p in (1, 2, 3):
            outcomes[p].append(serve_one(core, clock, f"p{p}-{i}", p, FAST_S))
            clock.advance(GAP_S)
    for p, got in outcomes.items():
        assert got == ["served"] * 30, (p, got)
