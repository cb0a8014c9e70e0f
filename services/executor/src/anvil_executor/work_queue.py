"""The executor's queue of received batches, most urgent first (issue #19).

The scheduler may send a batch that carries top-priority work while lower-priority batches already
wait here (it grants such a batch a reserved credit): that batch must run next, after the one running,
not after every batch queued ahead of it. A batch's rank is the most urgent priority among its requests
(read from their envelopes: 1 = interactive); equal ranks run in arrival order.

Producers: the I/O loop (``put`` of a received batch: decoded there, with its rank, or as received
for the prep queue) and the prep threads (``put`` of a prepared batch with its rank). Consumers: the
compute threads, or the prep threads for the prep queue (``get``, blocking; one of each per lane).
``None`` is the stop marker (one per consumer); it ranks after every batch, so the queued work is
finished before the threads end.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

from anvil_core import codec
from anvil_core.codec import pb
from anvil_executor import metrics as m

__all__ = ["LAST_RANK", "BatchQueue", "batch_priority"]

Item = Any  # (Batch, frames[, received ns]) as received, or a batch_runner.Pending from the prep thread
LAST_RANK = _LAST = 1 << 16  # ranks after any priority (a ubyte on the wire); the stop marker's rank


def batch_priority(batch: pb.BatchT, frames: list[Any]) -> int:
    """The most urgent (lowest) priority among the batch's requests; a malformed batch ranks last
    (run_batch answers it with its error in its turn)."""
    try:
        groups = codec.split_groups(frames, list(batch.frameCounts or ()))
        return min((int(codec.read_request(g[0]).priority) for g in groups), default=_LAST)
    except Exception:  # any decoding error: run_batch answers it with the reason
        return _LAST


class BatchQueue:
    """Thread-safe priority queue of (Batch, frames); ``get`` blocks until an item is there."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, float, Item | None]] = []  # (rank, seq, put at s or -1, item)
        self._seq = itertools.count()
        self._ready = threading.Condition(threading.Lock())
        self._waits = threading.local()  # per consumer thread: its last item's wait (`last_wait_us`)

    @property
    def last_wait_us(self) -> int:
        """The wait of the item `get` last returned to the calling thread: put -> taken, µs, or -1
        when the hop was not observed for it."""
        return int(getattr(self._waits, "us", 0))

    def put(self, item: Item | None, rank: int | None = None, observe: bool | None = None) -> None:
        """Queue an item, most urgent first. A received (Batch, frames) is ranked by its requests
        when `rank` is None; anything else (a decoded or prepared batch) comes with its `rank`.
        `observe`: whether `get` observes the hop "queued" (received -> taken) for it; by default
        only for a received batch ranked here (a prepared one's first queue observed it)."""
        if observe is None:
            observe = rank is None and item is not None
        if rank is None:
            rank = _LAST if item is None else batch_priority(item[0], item[1])
        with self._ready:
            heapq.heappush(
                self._heap, (rank, next(self._seq), time.perf_counter() if observe else -1.0, item)
            )
            self._ready.notify()

    def get(self) -> Item | None:
        """The most urgent item, blocking until there is one. `last_wait_us` (read on this thread) is
        then its wait here, µs, or -1 when the hop was not observed for it (`put`'s `observe`)."""
        with self._ready:
            while not self._heap:
                self._ready.wait()
            rank, _, put_at, item = heapq.heappop(self._heap)
        waited = -1
        if put_at >= 0:  # the hop "queued": received -> its work starts (prep or compute), by rank
            waited = int((time.perf_counter() - put_at) * 1e6)
            m.hop("queued", rank).observe(waited)
        self._waits.us = waited
        return item

    def __len__(self) -> int:
        with self._ready:
            return len(self._heap)
