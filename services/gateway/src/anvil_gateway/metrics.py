"""Gateway metrics (Prometheus). Names follow Triton's (`nv_inference_*` -> `anvil_inference_*`);
durations are in µs, as Triton's are."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_US = (100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000)

success = Counter("anvil_inference_request_success", "Successful inference requests", ["model", "version"])
failure = Counter(
    "anvil_inference_request_failure", "Failed inference requests by reason", ["model", "version", "reason"]
)
inference_count = Counter("anvil_inference_count", "Inferences performed (batch rows)", ["model", "version"])
request_us = Histogram(
    "anvil_inference_request_duration_us",
    "End-to-end request time at the gateway, µs",
    ["model"],
    buckets=_US,
)
queue_us = Histogram(
    "anvil_inference_queue_duration_us", "Time queued in the scheduler, µs", ["model"], buckets=_US
)
compute_us = Histogram(
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
