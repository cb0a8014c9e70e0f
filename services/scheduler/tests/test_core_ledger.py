"""Exactly-once ledger, SLO attainment window, dispatch pool bookkeeping."""

from anvil_scheduler.core import ExecutorPool, ExecutorSpec, RequestLedger, SLOTracker
from anvil_scheduler.core.shedding import evictions_needed


def test_ledger_answers_each_id_once() -> None:
    ledger = RequestLedger(retention_s=60.0)
    assert ledger.open("a", 0.0)
    assert not ledger.open("a", 0.0)
    assert ledger.close("a", 1.0)
    assert not ledger.close("a", 1.5)  # a second answer is refused and counted
    assert ledger.late_results_dropped == 1
    assert not ledger.open("a", 2.0)  # an answered id stays a duplicate for the retention window
    assert ledger.duplicates_rejected == 2


def test_ledger_forgets_answered_ids_after_retention() -> None:
    ledger = RequestLedger(retention_s=10.0)
    ledger.open("a", 0.0)
    ledger.close("a", 1.0)
    assert ledger.answered("a")
    assert ledger.open("a", 11.5)  # 10 s after the answer: a new request may reuse the id


def test_slo_attainment_over_a_sliding_window() -> None:
    slo = SLOTracker(window_s=10.0)
    for i in range(9):
        slo.record(1, True, float(i))
    slo.record(1, False, 9.0)
    assert slo.attainment(1, 9.0) == 0.9
    assert slo.attainment(1, 18.5) == 0.0  # only the miss at 9 s is still in the window
    assert slo.attainment(2, 9.0) is None
    assert slo.total_met[1] == 9 and slo.total[1] == 10


def test_slo_p99_is_over_the_windows_answers_with_a_result() -> None:
    slo = SLOTracker(window_s=10.0)
    assert slo.p99_s(1, 0.0) is None
    for i in range(200):  # latencies 1..200 ms, answered over 2 s
        slo.record(1, True, i * 0.01, latency_s=(i + 1) / 1000)
    slo.record(1, False, 2.0)  # shed: counts against attainment, has no latency
    assert slo.p99_s(1, 2.0) == 0.198  # nearest rank: the 198th of 200
    assert slo.attainment(1, 2.0) == 200 / 201
    slo.record(1, True, 12.5, latency_s=0.005)
    assert slo.p99_s(1, 12.5) == 0.005  # the first 200 left the window
    assert slo.p99_s(2, 12.5) is None


def test_pool_tracks_predicted_free_time_and_releases_credit() -> None:
    pool = ExecutorPool()
    pool.register(ExecutorSpec("e0", "gpu", 8, frozenset({"m"}), credits=2))
    predict = lambda device, n: 0.004 + 0.001 * n  # noqa: E731
    p = pool.place("m", 3, 8, predict, now_s=0.0, lead_s=0.0)
    assert p is not None and (p.size, p.cap, p.idle) == (3, 8, True) and p.finish_s == 0.007
    assert pool.predict_finish("m", 10, 8, predict, 0.0) == 0.012 + 0.006  # 8 then 2


def test_evictions_needed_is_the_fewest_that_make_the_deadline() -> None:
    finish = lambda pos: 0.01 * pos  # noqa: E731
    assert evictions_needed(5, 0.05, finish, 4) == 0
    assert evictions_needed(10, 0.07, finish, 5) == 3
    assert evictions_needed(10, 0.03, finish, 5) is None
