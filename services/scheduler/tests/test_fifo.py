"""The foundation's FIFO queues and executor pool (pure, clock passed in)."""

from __future__ import annotations

from anvil_scheduler.executors import ExecutorPool, ExecutorState
from anvil_scheduler.fifo import FifoQueues, Pending


def _p(rid: str, deadline: float = 10.0, model: str = "m") -> Pending:
    return Pending(rid, model, b"gw", None, [], 0.0, deadline)


def test_batches_leave_in_arrival_order_and_respect_the_size() -> None:
    q = FifoQueues(max_per_model=10)
    for i in range(5):
        assert q.push(_p(f"r{i}"))
    assert [p.request_id for p in q.pop_batch("m", 3)] == ["r0", "r1", "r2"]
    assert [p.request_id for p in q.pop_batch("m", 3)] == ["r3", "r4"]
    assert q.pop_batch("m", 3) == []


def test_full_queue_refuses() -> None:
    q = FifoQueues(max_per_model=1)
    assert q.push(_p("a"))
    assert not q.push(_p("b"))


def test_requeued_work_goes_first_in_order() -> None:
    q = FifoQueues(max_per_model=10)
    q.push(_p("new"))
    q.push_front([_p("old1"), _p("old2")])
    assert [p.request_id for p in q.pop_batch("m", 3)] == ["old1", "old2", "new"]


def test_expired_requests_are_removed_and_returned() -> None:
    q = FifoQueues(max_per_model=10)
    q.push(_p("late", deadline=1.0))
    q.push(_p("ok", deadline=5.0))
    assert [p.request_id for p in q.expired(now_s=2.0)] == ["late"]
    assert q.depth("m") == 1


def _ex(name: str, credits: int, models: set[str], seen: float = 0.0) -> ExecutorState:
    return ExecutorState(name.encode(), name, "cpu", 8, credits, models, seen)


def test_pool_picks_the_least_loaded_executor_that_serves_the_model() -> None:
    pool = ExecutorPool()
    a = pool.upsert(_ex("a", 2, {"m"}))
    pool.upsert(_ex("b", 2, {"other"}))
    a.inflight["x"] = [_p("r")]
    c = pool.upsert(_ex("c", 2, {"m"}))
    assert pool.pick("m") is c
    c.inflight["y"] = [_p("s")]
    c.inflight["z"] = [_p("t")]
    assert pool.pick("m") is a
    a.inflight["w"] = [_p("u")]
    assert pool.pick("m") is None  # no credits left anywhere


def test_removing_an_executor_returns_its_inflight_requests() -> None:
    pool = ExecutorPool()
    a = pool.upsert(_ex("a", 2, {"m"}))
    a.inflight["x"] = [_p("r1"), _p("r2")]
    assert [p.request_id for p in pool.remove(b"a")] == ["r1", "r2"]
    assert pool.remove(b"a") == []


def test_silent_executors_are_detected() -> None:
    pool = ExecutorPool()
    pool.upsert(_ex("a", 1, {"m"}, seen=0.0))
    pool.upsert(_ex("b", 1, {"m"}, seen=9.0))
    assert pool.silent(now_s=10.0, timeout_s=3.0) == [b"a"]


def test_reregistration_keeps_inflight_batches() -> None:
    pool = ExecutorPool()
    a = pool.upsert(_ex("a", 2, {"m"}))
    a.inflight["x"] = [_p("r")]
    again = pool.upsert(_ex("a", 4, {"m", "n"}))
    assert list(again.inflight) == ["x"] and again.credits == 4
