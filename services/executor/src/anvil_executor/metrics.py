"""Executor metrics (Prometheus); durations in µs."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

batches = Counter("anvil_executor_batches_total", "Batches run", ["model", "outcome"])
compute_us = Histogram(
    "anvil_executor_compute_duration_us",
    "Batch compute time, µs",
    ["model"],
    buckets=(10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 100_000),
)
inflight = Gauge("anvil_executor_inflight_batches", "Batches received and not yet answered")
connected = Gauge("anvil_executor_scheduler_connected", "1 when a scheduler endpoint is known")
