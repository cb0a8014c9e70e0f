"""Scheduler settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from anvil_core.settings import ServiceSettings

__all__ = ["SchedulerSettings"]


class SchedulerSettings(ServiceSettings):
    # ROUTER that gateways connect to, and ROUTER that executors connect to.
    gateway_port: int = 5555
    executor_port: int = 5556
    metrics_port: int = 8003
    # Upper bound on any batch, whatever the executor or model says.
    max_batch: int = 64
    # Requests waiting per model before new ones are refused with OVERLOAD.
    max_queue_per_model: int = 10_000
    # An executor silent for this long is declared lost and its in-flight batches re-dispatched.
    executor_timeout_ms: int = 3000
