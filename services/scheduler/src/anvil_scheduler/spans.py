"""The scheduler's spans of a dispatched batch (only when tracing is on: anvil_core.tracing).

* ``scheduler.queue``, one per request: admitted -> dispatched, the child of the gateway's root span
  of the request (``InferRequest.traceparent``), so it sits in the request's own trace.
* ``scheduler.batch``, one per batch: its oldest request's arrival -> dispatch (the time the batch
  took to form), with a span link to every sampled request's context. A span has one parent: it is
  the first sampled request's, so the batch shows in that trace and is reached from the others
  through their links. Its context travels to the executor in ``Batch.traceparent``.

Requests whose context is not sampled (flag 00) or absent get no span; a batch with no sampled
request gets none either.

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

    ctxs = [tracing.span_context(tp) for tp in contexts]  # parsed once; None: untraced
    sampled = [c for c in ctxs if c is not None and c.trace_flags.sampled]
    if not sampled:
        return None  # nothing of it is sampled (or traced at all): no spans, no trace of its own
    links = []
    for r, c in zip(batch.requests, ctxs, strict=True):
        if c is None or not c.trace_flags.sampled:
            continue
        links.append(tracing.link(c))
        attrs = {"anvil.model": r.model, "anvil.priority": r.priority, "anvil.batch.id": str(batch.batch_id)}
        start = wall(r.arrival_s)
        tracing.record("scheduler.queue", start, now_wall, parent_of=tracing.parent(c), attributes=attrs)
    up = sampled[0]
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
