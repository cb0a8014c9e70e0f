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
