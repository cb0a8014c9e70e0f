"""Gateway metrics (Prometheus, Triton-like names, durations in µs)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_US_BUCKETS = (
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    1_000_000,
    5_000_000,
)

requests = Counter("anvil_gateway_requests_total", "Inference requests", ["model", "outcome", "reason"])
request_us = Histogram(
    "anvil_gateway_request_duration_us",
    "Total request time at the gateway, µs",
    ["model"],
    buckets=_US_BUCKETS,
)
queue_us = Histogram(
    "anvil_gateway_queue_duration_us",
    "Scheduler queue time reported per request, µs",
    ["model"],
    buckets=_US_BUCKETS,
)
compute_us = Histogram(
    "anvil_gateway_compute_duration_us",
    "Executor compute time per request's batch, µs",
    ["model"],
    buckets=_US_BUCKETS,
)
inflight = Gauge("anvil_gateway_inflight_requests", "Requests received and not yet answered")
