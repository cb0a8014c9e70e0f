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
