"""The scheduler's spans of a dispatched batch (only when tracing is on: anvil_core.tracing).

* ``scheduler.queue``, one per request: admitted -> dispatched, the child of the gateway's dispatch
  span (``InferRequest.traceparent``), so it sits in the request's own trace.
* ``scheduler.batch``, one per batch: its oldest request's arrival -> dispatch (the time the batch
  took to form), with a span link to every request's context. A span has one parent: it is the
  first sampled request's, so the batch shows in that trace and is reached from the others through
  their links. Its context travels to the executor in ``Batch.traceparent``.

Times are the scheduler's monotonic clock mapped onto the wall clock at dispatch.
"""

from __future__ import annotations

import time
from typing import Any

from anvil_core import tracing

__all__ = ["record"]


def record(batch: Any, contexts: list[str], now_s: float, executor: str) -> str | None:
    """Spans of `batch` (core.Batch) dispatched at `now_s` (monotonic), its requests' traceparents
    in `contexts` (one per request, "" when untraced); returns the batch span's traceparent."""
    now_wall = time.time_ns()

    def wall(mono_s: float) -> int:
        return now_wall - int((now_s - mono_s) * 1e9)

    links = []
    for r, tp in zip(batch.requests, contexts, strict=True):
        if not tp:
            continue
        links.append(tracing.link(tp))
        attrs = {"anvil.model": r.model, "anvil.priority": r.priority, "anvil.batch.id": str(batch.batch_id)}
        tracing.record(
            "scheduler.queue", wall(r.arrival_s), now_wall, parent_of=tracing.parent(tp), attributes=attrs
        )
    traced = [tp for tp in contexts if tp]
    up = next((tp for tp in traced if tracing.sampled(tp)), traced[0] if traced else None)
    attrs = {
        "anvil.model": batch.model,
        "anvil.batch.id": str(batch.batch_id),
        "anvil.batch.requests": batch.size,
        "anvil.executor": executor,
    }
    start = wall(min(r.arrival_s for r in batch.requests))
    span = tracing.record(
        "scheduler.batch", start, now_wall, parent_of=tracing.parent(up), links=links, attributes=attrs
    )
    return tracing.traceparent_of(span)
