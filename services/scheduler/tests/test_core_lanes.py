"""Executors with several compute lanes (Register.lanes, ANVIL_LANES on the executor): the pool sends
a laned executor as many batches at once as it has lanes, each starting at once, predicts the
queue's drain with every lane as a server, and counts the executor idle while a lane is free."""

from __future__ import annotations

import pytest

from anvil_scheduler.core import ExecutorSpec
from anvil_scheduler.core.dispatch import ExecutorPool
from anvil_scheduler.core.request import Batch


def predict(device: str, b: int) -> float:
    return 0.004 + 0.001 * b


def _batch(bid: int, eid: str = "e0") -> Batch:
    return Batch(bid, "m", eid, "cpu", [], formed_s=0.0, opened_s=0.0, predicted_exec_s=predict("cpu", 8))


def test_a_laned_executor_starts_one_batch_per_lane_at_once() -> None:
    pool = ExecutorPool()
    pool.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=8, lanes=4))
    for bid in range(4):
        place = pool.place("m", 8, 8, predict, 0.0, lead_s=0.0)
        assert place is not None and place.start_s == 0.0 and place.idle, bid
        assert pool.idle_host("m") == "e0"
        pool.assign(_batch(bid), 0.0)
    assert pool.idle_host("m") is None  # every lane runs a batch
    fifth = pool.place("m", 8, 8, predict, 0.0, lead_s=0.0)
    assert fifth is not None and not fifth.idle and fifth.start_s == pytest.approx(predict("cpu", 8))
    assert pool.work_ahead_s("e0", 0.0) == pytest.approx(4 * predict("cpu", 8))
    pool.complete(2, "e0", 0.005)  # one lane frees: a new batch starts at once again
    again = pool.place("m", 8, 8, predict, 0.005, lead_s=0.0)
    assert again is not None and again.start_s == 0.005 and again.idle


def test_one_lane_keeps_the_serial_executor() -> None:
    pool = ExecutorPool()
    pool.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=2))
    pool.assign(_batch(0), 0.0)
    second = pool.place("m", 8, 8, predict, 0.0, lead_s=0.0)
    assert second is not None and second.start_s == pytest.approx(predict("cpu", 8)) and not second.idle
    assert pool.idle_host("m") is None


def test_the_drain_of_a_two_lane_executor_is_that_of_two_one_lane_executors() -> None:
    laned, pair = ExecutorPool(), ExecutorPool()
    laned.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=4, lanes=2))
    pair.register(ExecutorSpec("a", "cpu", 32, frozenset({"m"}), credits=2))
    pair.register(ExecutorSpec("b", "cpu", 32, frozenset({"m"}), credits=2))
    for position in (1, 5, 33, 64, 100, 5_000, 20_000):
        for cap in (1, 8, 32):
            got = laned.predict_finish("m", position, cap, predict, 1.0)
            want = pair.predict_finish("m", position, cap, predict, 1.0)
            assert got == pytest.approx(want), (position, cap)
    one = ExecutorPool()
    one.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=2))
    assert laned.predict_finish("m", 64, 8, predict, 1.0) < one.predict_finish("m", 64, 8, predict, 1.0)


def test_lanes_out_of_range_are_refused() -> None:
    for lanes in (0, 17):
        with pytest.raises(ValueError, match=r"lanes must be in 1\.\.16"):
            ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), lanes=lanes)


def test_a_re_registration_with_more_lanes_spreads_its_in_flight_work() -> None:
    pool = ExecutorPool()
    pool.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=4))
    pool.assign(_batch(0), 0.0)
    pool.assign(_batch(1), 0.0)
    assert pool.idle_host("m") is None
    pool.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), credits=8, lanes=4))
    assert pool.idle_host("m") == "e0"  # two lanes still free
    assert len(pool.in_flight("e0")) == 2


def test_ties_spread_over_executors_before_a_second_lane_of_one() -> None:
    pool = ExecutorPool()
    for eid in ("a", "b", "c"):
        pool.register(ExecutorSpec(eid, "cpu", 32, frozenset({"m"}), credits=4, lanes=2))
    placed = []
    for bid in range(6):
        place = pool.place("m", 8, 8, predict, 0.0, lead_s=0.0)
        assert place is not None and place.start_s == 0.0, bid  # every one starts at once: a tie
        placed.append(place.executor_id)
        pool.assign(_batch(bid, place.executor_id), 0.0)
    assert placed == ["a", "b", "c", "a", "b", "c"]  # one lane of each, then the second lanes
    pool.complete(1, "b", 0.001)  # b has one batch left, a and c two: b is the only tie left
    again = pool.place("m", 8, 8, predict, 0.001, lead_s=0.0)
    assert again is not None and again.executor_id == "b"
