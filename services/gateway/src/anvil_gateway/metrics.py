"""Gateway metrics (Prometheus). Names follow Triton's (`nv_inference_*` -> `anvil_inference_*`);
durations are in µs, as Triton's are."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

from anvil_core.metrics import FastHistogram
from anvil_core.priorities import PRIORITIES

_US = (100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000)

success = Counter("anvil_inference_request_success", "Successful inference requests", ["model", "version"])
failure = Counter(
    "anvil_inference_request_failure", "Failed inference requests by reason", ["model", "version", "reason"]
)
inference_count = Counter("anvil_inference_count", "Inferences performed (batch rows)", ["model", "version"])
request_us = FastHistogram(
    "anvil_inference_request_duration_us",
    "End-to-end request time at the gateway, µs",
    ["model"],
    buckets=_US,
)
queue_us = FastHistogram(
    "anvil_inference_queue_duration_us", "Time queued in the scheduler, µs", ["model"], buckets=_US
)
compute_us = FastHistogram(
    "anvil_inference_compute_infer_duration_us",
    "Executor time of the request's batch, µs",
    ["model"],
    buckets=_US,
)
inflight = Gauge("anvil_inference_inflight", "Requests received and not yet answered")
admission_rejected = Counter(
    "anvil_admission_rejected_total", "Requests refused at admission", ["tenant", "priority", "reason"]
)
shm_regions = Gauge("anvil_shm_regions", "Registered system shared-memory regions")
direct_requests = Counter(
    "anvil_gateway_direct_requests_total",
    "Lone requests this gateway sent an executor itself (direct requests, docs/scheduler.md), by what "
    "became of them: sent, busy (handed back: sent through the scheduler) or lost (the executor's "
    "connection ended before the answer: sent through the scheduler)",
    ["outcome"],
)


class _ModelSeries:
    """One model's success series, resolved once: `labels()` costs a lock and a dict per call."""

    __slots__ = ("compute", "count", "queue", "request", "success")

    def __init__(self, model: str, version: str) -> None:
        self.success = success.labels(model=model, version=version)
        self.count = inference_count.labels(model=model, version=version)
        self.request = request_us.labels(model=model)
        self.queue = queue_us.labels(model=model)
        self.compute = compute_us.labels(model=model)


_series: dict[tuple[str, str], _ModelSeries] = {}


def record_success(
    model: str, version: str, rows: int, total_us: float, queue: float | None, compute: float | None
) -> None:
    """Count one answered request of `rows` rows; queue and compute in µs (None: not measured)."""
    series = _series.get((model, version))
    if series is None:
        series = _series[(model, version)] = _ModelSeries(model, version)
    series.success.inc()
    series.count.inc(rows)
    series.request.observe(total_us)
    if queue is not None:
        series.queue.observe(queue)
    if compute is not None:
        series.compute.observe(compute)


# Per hop and priority (issue #19; hops.py says what each hop spans). Labels are bounded: five hops
# and transit's four parts (hops.TRANSIT_HOPS, last), priorities 1-3 (anything else is "other").
HOP_NAMES = (
    "gateway_in", "scheduler_queue", "compute", "transit", "gateway_out",
    "to_scheduler", "to_executor", "executor_queue", "back",
)  # fmt: skip
hop_us = FastHistogram(
    "anvil_gateway_hop_us",
    "Time of an answered request per hop, µs",
    ["hop", "priority"],
    buckets=(50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000),
)
_hop_series: dict[int, tuple[Any, ...]] = {}


def hop_series(priority: int) -> tuple[Any, ...]:
    """The hop histograms of `priority`, resolved once (in HOP_NAMES order)."""
    series = _hop_series.get(priority)
    if series is None:
        label = str(priority) if priority in PRIORITIES else "other"
        series = _hop_series[priority] = tuple(hop_us.labels(hop=h, priority=label) for h in HOP_NAMES)
    return series
