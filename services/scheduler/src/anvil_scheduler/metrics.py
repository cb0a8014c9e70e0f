"""Scheduler metrics (Prometheus). Durations in µs, like Triton's."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from anvil_core.codec import ERROR_NAMES
from anvil_core.metrics import FastHistogram

queue_depth = Gauge("anvil_scheduler_queue_depth", "Requests waiting", ["model", "priority"])
target_batch = Gauge("anvil_scheduler_target_batch", "B*: the PID (or policy) target batch size", ["model"])
executors = Gauge("anvil_scheduler_executors", "Executors connected")
unix_peers = Gauge(
    "anvil_scheduler_unix_link_peers", "Peers connected over the same-host Unix stream links", ["link"]
)
batches = Counter("anvil_scheduler_batches_total", "Batches dispatched", ["model"])
batch_size = FastHistogram(
    "anvil_scheduler_batch_size",
    "Requests per dispatched batch",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
requests = Counter("anvil_scheduler_requests_total", "Requests answered", ["model", "outcome"])
shed = Counter("anvil_scheduler_shed_total", "Requests shed", ["model", "reason", "priority"])
slo_attainment = Gauge(
    "anvil_scheduler_slo_attainment", "Share answered within SLO (sliding window)", ["priority"]
)
redispatched = Counter("anvil_scheduler_redispatched_total", "Requests re-queued after executor loss")
duplicates = Counter("anvil_scheduler_duplicates_total", "Messages dropped as duplicates", ["what"])
batch_rtt_us = FastHistogram(
    "anvil_scheduler_batch_round_trip_us",
    "Dispatch to result of a batch, µs",
    ["model"],
    buckets=(100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000),
)
pid_measured = Gauge(
    "anvil_scheduler_pid_measured", "EDF+PID input: windowed p99 of best-case latency / budget", ["model"]
)
host_cpu_busy = Gauge("anvil_scheduler_host_cpu_busy", "Host CPU busy fraction (/proc/stat, smoothed), 0-1")
cpu_window_us = Gauge("anvil_scheduler_cpu_window_us", "EDF+PID CPU batching window open now (µs; 0: shut)")
batch_ceiling = Gauge("anvil_scheduler_batch_ceiling", "EDF+PID feedforward ceiling on B*", ["model"])

# Idle means zero: each of these reads 0 once every admitted request has been answered.
in_flight_batches = Gauge("anvil_scheduler_in_flight_batches", "Batches sent and not yet reported or lost")
in_flight_requests = Gauge(
    "anvil_scheduler_in_flight_requests", "Requests in batches sent and not yet reported"
)
open_requests = Gauge("anvil_scheduler_open_requests", "Admitted requests not yet answered")
work_ahead_us = Gauge(
    "anvil_scheduler_work_ahead_us", "Predicted in-flight execution still ahead, summed, µs"
)
awaiting_result_batches = Gauge(
    "anvil_scheduler_awaiting_result_batches", "Batches whose send time is kept for the round-trip metric"
)


def forget_model(model: str, priorities: Iterable[int]) -> None:
    """Remove every series of an undeployed model (metrics stay bounded across deploys)."""
    prios = [str(p) for p in priorities]
    outcomes = ["answered", "error", *(n.lower() for n in ERROR_NAMES.values())]
    labelled: list[tuple[object, list[tuple[str, ...]]]] = [
        (queue_depth, [(model, p) for p in prios]),
        (requests, [(model, o) for o in outcomes]),
        (shed, [(model, r, p) for r in ("deadline", "overload") for p in prios]),
    ]
    labelled += [
        (g, [(model,)])
        for g in (target_batch, batches, batch_size, batch_rtt_us, pid_measured, batch_ceiling)
    ]
    for metric, label_sets in labelled:
        for labels in label_sets:
            try:
                metric.remove(*labels)  # type: ignore[attr-defined]
            except KeyError:
                pass


# Per hop and priority (issue #19). queue: admitted -> dispatched in a batch; executor_round_trip:
# dispatched -> its batch's result back (both links, the executor's queue and its compute). Labels are
# bounded: two hops, the configured priority classes.
hop_us = FastHistogram(
    "anvil_scheduler_hop_us",
    "Time of a request per hop inside and behind the scheduler, µs",
    ["hop", "priority"],
    buckets=(50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000),
)
