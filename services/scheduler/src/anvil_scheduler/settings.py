"""Scheduler settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Self

from pydantic import Field, model_validator

from anvil_core.priorities import PRIORITIES, PRIORITY_NAMES
from anvil_core.settings import ServiceSettings
from anvil_scheduler.core.config import PriorityClass, SchedulerConfig

__all__ = ["SchedulerSettings"]


class SchedulerSettings(ServiceSettings):
    REDIS_ROLE: ClassVar[str] = "scheduler"
    # ROUTER that gateways connect to, and ROUTER that executors connect to.
    gateway_port: int = 5555
    executor_port: int = 5556
    # Interface of both ROUTERs: every interface in a container (the compose network, never
    # published); `anvil up` sets 127.0.0.1 unless ANVIL_LINK_BIND_HOST says otherwise.
    link_bind_host: str = "0.0.0.0"
    metrics_port: int = 8003
    # Direct answers: a batch names, per request, its gateway when that gateway is on this host's
    # Unix link, and the executor (also on the Unix link) answers it on the gateway's answer socket
    # itself; the scheduler then forwards only what an executor could not deliver (docs/scheduler.md).
    direct_answers: bool = True
    # Batching policy: ours (EDF + PID), or the peers it is compared with.
    policy: Literal["edf_pid", "fixed_delay", "aimd"] = "edf_pid"
    # fixed_delay only (Triton's dynamic batcher knobs).
    fixed_max_batch: int = 32
    fixed_max_queue_delay_us: int = 1000
    # Margin kept between a predicted finish and a deadline (EDF+PID's release, batch size and
    # admission): slack_guard_us + slack_guard_fraction x the predicted horizon (core/config.py says
    # why 2 ms and 10%). What it covers lies outside the scheduler's view: the links, the gateway's
    # answer and the client's HTTP (bench/live_scheduling.py --model busy measures it).
    slack_guard_us: Annotated[int, Field(ge=0, le=10_000_000)] = SchedulerConfig.slack_guard_us
    slack_guard_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = SchedulerConfig.slack_guard_fraction
    # EDF+PID releases a full batch of lower-priority work for a busy executor only as it is about to
    # free up (core/config.py). Off by default: it trades a little priority-1 attainment for goodput.
    late_binding: bool = SchedulerConfig.late_binding
    # CPU batching window (EDF+PID, core/config.py): while this host's CPUs are busy (/proc/stat), a
    # batch not led by priority 1 waits up to this long after its head arrived for more requests,
    # instead of leaving the moment an executor is idle; it opens from cpu_busy_low to cpu_busy_high
    # (busy fraction). 0 turns it off.
    cpu_window_us: Annotated[int, Field(ge=0, le=1_000_000)] = SchedulerConfig.cpu_window_us
    cpu_busy_low: Annotated[float, Field(ge=0.0, lt=1.0)] = SchedulerConfig.cpu_busy_low
    cpu_busy_high: Annotated[float, Field(gt=0.0, le=1.0)] = SchedulerConfig.cpu_busy_high
    # SLO attainment and p99 (published to `anvil:slo` for qos) are over answers of this window.
    slo_window_ms: int = 10000
    # Requests waiting per model before the lowest-priority ones are shed with OVERLOAD.
    max_queue_per_model: int = 4096
    # An executor silent for this long is declared lost and its in-flight batches re-dispatched.
    executor_timeout_ms: int = 3000
    # Learned latency profiles and SLO attainment are published to Redis this often.
    publish_interval_ms: int = 1000
    # The registry's model records are read this often for undeploys (status UNLOADED): requests
    # queued for an undeployed model are answered within about this long.
    model_sync_interval_ms: int = 250

    def core_config(self) -> SchedulerConfig:
        """The core's configuration from these settings (priorities with their SLOs, queue, guard,
        late binding, CPU batching window)."""
        return SchedulerConfig(
            priorities=tuple(PriorityClass(p, PRIORITY_NAMES[p], self.slo_ms(p)) for p in PRIORITIES),
            max_queue_depth=self.max_queue_per_model,
            slo_window_s=self.slo_window_ms / 1000,
            slack_guard_us=self.slack_guard_us,
            slack_guard_fraction=self.slack_guard_fraction,
            late_binding=self.late_binding,
            cpu_window_us=self.cpu_window_us,
            cpu_busy_low=self.cpu_busy_low,
            cpu_busy_high=self.cpu_busy_high,
        )

    @model_validator(mode="after")
    def _core_accepts(self) -> Self:
        """What the core's configuration refuses (e.g. cpu_busy_low not below cpu_busy_high) is refused
        here, when the settings are read, before the service binds anything."""
        self.core_config()
        return self
