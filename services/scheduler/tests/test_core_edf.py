"""EDF queue order, FIFO ties, arrival order for the peers, eviction candidates."""

from anvil_scheduler.core import DEFAULT_PRIORITIES, EDFQueue, QueueOrder, Request

P = {p.priority: p for p in DEFAULT_PRIORITIES}


def req(rid: str, priority: int, arrival_s: float, timeout_s: float | None = None) -> Request:
    return Request.create(rid, "m", P[priority], arrival_s, timeout_s)


def test_pops_in_deadline_order_across_priorities() -> None:
    q = EDFQueue()
    q.push(req("p3", 3, 0.000))  # deadline 2.000
    q.push(req("p2", 2, 0.010))  # deadline 0.210
    q.push(req("p1", 1, 0.020))  # deadline 0.070
    q.push(req("p2b", 2, 0.000))  # deadline 0.200
    assert [r.request_id for r in q.pop_batch(10)] == ["p1", "p2b", "p2", "p3"]
    assert len(q) == 0 and q.peek() is None


def test_equal_deadlines_leave_in_arrival_order() -> None:
    q = EDFQueue()
    for i in range(5):
        q.push(req(f"r{i}", 2, 1.0))
    assert [r.request_id for r in q.pop_batch(3)] == ["r0", "r1", "r2"]
    assert q.pop().request_id == "r3"


def test_out_of_order_deadline_within_a_class_is_inserted_in_place() -> None:
    q = EDFQueue()
    q.push(req("late", 2, 0.0))  # deadline 0.200
    q.push(req("tight", 2, 0.01, timeout_s=0.05))  # deadline 0.060
    assert q.peek() is not None and q.peek().request_id == "tight"  # type: ignore[union-attr]


def test_arrival_order_for_fifo_policies() -> None:
    q = EDFQueue(QueueOrder.ARRIVAL)
    q.push(req("p3", 3, 0.0))
    q.push(req("p1", 1, 0.1))
    assert [r.request_id for r in q.pop_batch(2)] == ["p3", "p1"]


def test_count_through_and_depth_by_priority() -> None:
    q = EDFQueue()
    for i, (p, t) in enumerate([(1, 0.0), (2, 0.0), (2, 0.1), (3, 0.0)]):
        q.push(req(f"r{i}", p, t))
    assert q.count_through(0.2) == 2  # deadlines 0.05 and 0.2
    assert q.count_through(10.0) == 4
    assert q.depth_by_priority() == {1: 1, 2: 2, 3: 1}


def test_eviction_candidates_lowest_priority_then_latest_deadline() -> None:
    q = EDFQueue()
    a, b, c, d = req("p3a", 3, 0.0), req("p3b", 3, 0.5), req("p2", 2, 0.0), req("p1", 1, 0.0)
    for r in (a, b, c, d):
        q.push(r)
    assert q.eviction_candidates(below=1, count=4) == [b, a, c]
    assert q.eviction_candidates(below=2, count=4) == [b, a]
    assert q.eviction_candidates(below=3, count=4) == []
    assert q.eviction_candidates(below=1, count=4, key_at_most=1.0) == [c]  # only those ahead of 1.0
    q.remove(b)
    assert len(q) == 3 and b not in list(q)
