"""Executor metrics (Prometheus); durations in µs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Gauge

from anvil_core.metrics import FastHistogram
from anvil_core.priorities import PRIORITIES

batches = Counter("anvil_executor_batches_total", "Batches run", ["model", "outcome"])
compute_us = FastHistogram(
    "anvil_executor_compute_duration_us",
    "Batch compute time, µs",
    ["model"],
    buckets=(10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 100_000),
)
inflight = Gauge("anvil_executor_inflight_batches", "Batches received and not yet answered")
answers = Counter(
    "anvil_executor_answers_total",
    "Answers of batches that name their requests' gateways (direct answers), by the way they went: "
    "direct (the gateway's answer socket) or scheduler (no gateway named for it, or the write failed)",
    ["path"],
)
direct_requests = Counter(
    "anvil_executor_direct_requests_total",
    "Requests a gateway sent this executor itself (direct requests, docs/scheduler.md), by outcome: "
    "ran (idle, a fast model: run on the I/O loop and answered to the gateway) or busy (handed back: "
    "the gateway sent it through the scheduler)",
    ["outcome"],
)
connected = Gauge("anvil_executor_scheduler_connected", "1 when a scheduler endpoint is known")

# GPU backend (ANVIL_DEVICE=cuda:N): the steady state must allocate nothing and load no module.
device_allocations = Gauge(
    "anvil_executor_device_allocations_steady",
    "CuPy device allocations since every model was loaded (0 in a correct steady state)",
)
module_loads = Gauge(
    "anvil_executor_module_loads_steady", "Kernel modules loaded since every model was loaded (0 expected)"
)
graphs = Gauge("anvil_executor_cuda_graphs", "CUDA graphs captured (one per shape bucket)", ["model"])
padding_waste = Gauge(
    "anvil_executor_padding_waste_ratio",
    "Share of the (row, token) cells run that were bucket padding",
    ["model"],
)
device_bytes = Gauge("anvil_executor_device_arena_bytes", "Device arena bytes per bank", ["model", "bank"])
# seconds, not µs: a per-model load-time figure (the Prometheus base unit), set once per load
warmup_seconds = Gauge(
    "anvil_executor_warmup_seconds", "Wall time of the last warm-up of a model before READY, s", ["model"]
)

# Model loading (loader.py): a failing load retries with back-off; these say which and how often.
load_failures = Counter(
    "anvil_executor_model_load_failures_total", "Failed attempts to load a model", ["model"]
)
load_failing = Gauge(
    "anvil_executor_model_load_failing", "1 while the last load of a model failed", ["model"]
)

# Per hop and priority (issue #19). queued: batch received -> its compute starts (labelled with the
# batch's most urgent priority); compute: the batch's run, observed once per request with that
# request's priority. Labels are bounded: two hops, priorities 1-3 or "other".
hop_us = FastHistogram(
    "anvil_executor_hop_us",
    "Time of a batch (queued) or request (compute) per hop at the executor, µs",
    ["hop", "priority"],
    buckets=(50, 100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000),
)


def priority_label(priority: int) -> str:
    return str(priority) if priority in PRIORITIES else "other"


_hop_series: dict[tuple[str, int], Any] = {}


def hop(name: str, priority: int) -> Any:
    """The `hop_us` series of (hop, priority), resolved once (prometheus_client's `labels` takes a
    lock and validates: several µs, once per request on the compute path). Any thread."""
    series = _hop_series.get((name, priority))
    if series is None:
        series = _hop_series[(name, priority)] = hop_us.labels(hop=name, priority=priority_label(priority))
    return series


class _GpuPhases:
    """A collector of the GPU plans' host time per run phase (plan_runtime/gpu_model.PHASES: stage,
    launch, wait, fetch), read from the models at scrape time: where a batch's `compute_infer` goes
    besides the model's own Python. Exported as anvil_executor_gpu_phase_us_total{model, phase} and
    anvil_executor_gpu_runs_total{model} (runs: chunks, one graph launch each); served batches only."""

    def __init__(self, plans: Callable[[], Mapping[str, Any]]) -> None:
        self._plans = plans

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        from anvil_executor.plan_runtime.gpu_model import PHASES

        us = CounterMetricFamily(
            "anvil_executor_gpu_phase_us",
            "Host time of the GPU plans' runs per phase (stage, launch, wait, fetch), µs",
            labels=["model", "phase"],
        )
        runs = CounterMetricFamily(
            "anvil_executor_gpu_runs", "GPU plan runs (graph launches)", labels=["model"]
        )
        for name, plan in list(self._plans().items()):
            phase_ns = list(getattr(plan, "phase_ns", ()))
            if len(phase_ns) != len(PHASES):
                continue
            for phase, ns in zip(PHASES, phase_ns, strict=True):
                us.add_metric([name, phase], ns / 1000)
            runs.add_metric([name], int(getattr(plan, "runs", 0)))
        yield us
        yield runs


_gpu_phases_registered = False


def register_gpu_phases(plans: Callable[[], Mapping[str, Any]]) -> None:
    """Export the GPU plans' phase times (``plans``: the executor's GPU plans by model name, read
    at each scrape). Once per process."""
    global _gpu_phases_registered
    if _gpu_phases_registered:
        return
    from prometheus_client import REGISTRY

    REGISTRY.register(_GpuPhases(plans))
    _gpu_phases_registered = True
