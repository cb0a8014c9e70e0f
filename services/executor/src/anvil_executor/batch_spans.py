"""The executor's spans of one batch (only when tracing is on: anvil_core.tracing).

``executor.batch`` covers ``run_batch`` and has three children measured by it: ``executor.copy_in``
(inputs decoded, checked, gathered), ``executor.compute`` (the model run), ``executor.copy_out``
(outputs into payload buffers). A batch serves many requests, each with its own trace, so the
batch span is the child of the scheduler's ``scheduler.batch`` span (``Batch.traceparent``; of the
first request when the scheduler does not trace) and carries a span link to each of its requests'
contexts (``InferRequest.traceparent``, the gateway's root span of each): one request's trace reaches
the batch through that link (docs/observability.md). Unsampled contexts (flag 00) get no link; a
batch with none sampled gets no span.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from anvil_core import tracing

__all__ = ["record"]


def record(
    batch_id: str,
    batch_traceparent: str,
    model: str,
    requests: Sequence[Any],
    ran: int,
    stamps: Sequence[int],
    executor_id: str,
    device: str,
) -> None:
    """Spans of a finished batch: `requests` its decoded InferRequests (None: refused), `ran` how
    many ran, `stamps` perf_counter_ns: copy-in start and end, and when the model ran, run start,
    run end and copy-out end (the copy-in may have run on the prep thread, before a wait)."""
    now_perf, now_wall = time.perf_counter_ns(), time.time_ns()

    def wall(perf_ns: int) -> int:
        return tracing.wall_ns(perf_ns, now_perf, now_wall)

    ctxs = [tracing.span_context(r.traceparent) for r in requests if r is not None and r.traceparent]
    sampled = [c for c in ctxs if c is not None and c.trace_flags.sampled]  # each parsed once
    up = tracing.span_context(batch_traceparent) if batch_traceparent else None
    if up is None and not sampled:
        return  # no request of it is sampled or traced (ZeroCopy, an untraced gateway): no spans
    up = up or sampled[0]
    attrs = {
        "anvil.model": model,
        "anvil.batch.id": batch_id,
        "anvil.batch.requests": len(requests),
        "anvil.batch.ran": ran,
        "anvil.executor": executor_id,
        "anvil.device": device,
    }
    links = [tracing.link(c) for c in sampled]
    top = tracing.record(
        "executor.batch",
        wall(stamps[0]),
        now_wall,
        parent_of=tracing.parent(up),
        links=links,
        attributes=attrs,
    )
    parts = [("executor.copy_in", stamps[0], stamps[1])]
    if len(stamps) == 5:
        parts += [("executor.compute", stamps[2], stamps[3]), ("executor.copy_out", stamps[3], stamps[4])]
    for name, start, end in parts:
        tracing.record(name, wall(start), wall(end), parent_of=top)
