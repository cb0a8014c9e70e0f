"""The executor's batch queue runs the most urgent batch first (#19), in arrival order among equals,
and finishes queued work before the stop marker."""

from __future__ import annotations

import threading

from anvil_core import codec
from anvil_core.codec import pb
from anvil_executor.work_queue import BatchQueue, batch_priority


def batch(name: str, *priorities: int) -> tuple[pb.BatchT, list[bytes]]:
    b = pb.BatchT()
    b.batchId = name
    b.model = "m"
    b.frameCounts = [1] * len(priorities)
    frames = [
        codec.build_request(
            request_id=f"{name}-{i}", trace_id="t", model="m", version="1", priority=p,
            deadline_unix_ns=1, tenant="default",
        )
        for i, p in enumerate(priorities)
    ]  # fmt: skip
    return b, frames


def test_a_batch_ranks_by_its_most_urgent_request_and_a_malformed_one_ranks_last() -> None:
    assert batch_priority(*batch("a", 3, 1, 2)) == 1
    assert batch_priority(*batch("b", 3, 3)) == 3
    b, frames = batch("c", 1)
    b.frameCounts = [2]  # counts that do not add up: run_batch will answer it with the error
    assert batch_priority(b, frames) > 3


def test_urgent_batches_overtake_queued_ones_and_stop_comes_after_the_work() -> None:
    q = BatchQueue()
    for item in (batch("p3-a", 3, 3), batch("p2", 2), None, batch("p3-b", 3), batch("p1", 3, 1)):
        q.put(item)
    order = []
    while (item := q.get()) is not None:
        order.append(item[0].batchId)
    assert order == ["p1", "p2", "p3-a", "p3-b"]
    assert len(q) == 0


def test_get_blocks_until_a_batch_is_put() -> None:
    q = BatchQueue()
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(q.get()))
    consumer.start()
    q.put(batch("late", 2))
    consumer.join(5)
    assert not consumer.is_alive() and got[0] is not None
