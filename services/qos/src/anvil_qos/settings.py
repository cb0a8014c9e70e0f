"""QoS settings (env: ANVIL_<FIELD>, e.g. ANVIL_TICK_MS=250). docs/qos.md has the table."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from anvil_core.settings import ServiceSettings
from anvil_qos.baseline import Band, Calibrator
from anvil_qos.policy import PolicyConfig

__all__ = ["QosSettings"]


class QosSettings(ServiceSettings):
    REDIS_ROLE: ClassVar[str] = "qos"
    metrics_port: int = 8006

    # -- observation -----------------------------------------------------------------------------
    # One tick samples the probes, reads anvil:slo and runs the policy. 500 ms: twice per scheduler
    # SLO publication (1 s), cheap (a few BPF map reads).
    tick_ms: int = 500
    # Percentiles and rates are taken over this window: long enough for a p99 of a service waking
    # every few ms, short enough to react within a few SLO windows.
    signal_window_ms: int = 2000
    # Registry kinds whose processes are probed (run-queue delay, CPU; executors also GPU).
    target_kinds: str = "gateway,scheduler,executor"
    # Extra processes, "kind=pid[:port],...": for tests and processes outside the registry.
    targets: str = ""
    # Gateway HTTP ports whose TCP sockets are watched, besides the http_port of gateway records.
    tcp_ports: str = "8000"
    # Use /proc even where eBPF would load (comparison, debugging).
    force_procfs: bool = False
    # GPU probe on executors: a uprobe costs every cuLaunchKernel a trap (~1-10 µs, docs/qos.md);
    # turn it off for executors that launch more than ~10k kernels/s without CUDA graphs.
    cuda_probe: bool = True
    # libcuda to probe; empty: the one executors map, else the host's (ldconfig).
    cuda_library: str = ""

    # -- policy (anvil_qos.policy.PolicyConfig documents each) -------------------------------------
    # Default base rates {"tenant:priority": {"rate_rps": r, "burst": b}}; the anvil:qos:base hash
    # (operators) overrides them field by field.
    base_rates: dict[str, Any] = Field(default_factory=dict)
    attainment_low: float = 0.99
    attainment_ok: float = 0.995
    headroom_low: float = 0.2
    headroom_ok: float = 0.35
    slo_min_requests: int = 20
    slo_stale_ms: int = 5000
    # -- calibration (anvil_qos.baseline): pressure = a measure over
    #    clamp(max(baseline_ratio x calm median, calm median + baseline_sigmas x sigma), _min, _max)
    # Twice the calm level and 4 sigma (MAD-based) out of the calm noise: a CPU hog on the core moved
    # the run-queue mean 50-500x and the p99 5-50x on the CI VMs.
    baseline_ratio: float = 2.0
    baseline_sigmas: float = 4.0
    # Calm ticks before a target's baseline counts (until then only the _max ceilings act): 10 s.
    baseline_min_samples: int = 20
    # Calm values kept per (measure, target): 2 min of ticks, a few KiB per target.
    baseline_capacity: int = 240
    # No learning this long after a decrease: the measures still show the pressure that caused it.
    baseline_quiet_ms: int = 5000
    # Floors: never pressure below (1 ms of CPU wait at p99 is 2% of p1's 50 ms SLO; a 100 µs mean
    # wait is noise for any service). Ceilings: always pressure above, however noisy the host was
    # when calm (20 ms at p99 is 40% of p1's SLO per hop).
    runq_p99_us_min: float = 1000.0
    runq_p99_us_max: float = 20000.0
    runq_mean_us_min: float = 100.0
    runq_mean_us_max: float = 5000.0
    retransmits_per_s_min: float = 5.0  # loopback/LAN should see ~0
    retransmits_per_s_max: float = 50.0
    # An executor blocked on the GPU 95% of wall time is GPU-bound: absolute (floor = ceiling).
    gpu_sync_wait_share_max: float = 0.95
    pressure_clear_ratio: float = 0.5
    md_factor: float = 0.5
    md_interval_ms: int = 1000
    floor_frac: float = 0.05
    ai_step_frac: float = 0.1
    ai_interval_ms: int = 1000
    healthy_hold_ms: int = 5000

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            attainment_low=self.attainment_low,
            attainment_ok=self.attainment_ok,
            headroom_low=self.headroom_low,
            headroom_ok=self.headroom_ok,
            p1_slo_ms=float(self.slo_p1_ms),  # when anvil:slo readings carry no slo_ms
            min_requests=self.slo_min_requests,
            slo_stale_s=self.slo_stale_ms / 1000,
            thresholds={name: band.ceiling for name, band in self.bands().items()},
            clear_ratio=self.pressure_clear_ratio,
            md_factor=self.md_factor,
            md_interval_s=self.md_interval_ms / 1000,
            floor_frac=self.floor_frac,
            ai_step_frac=self.ai_step_frac,
            ai_interval_s=self.ai_interval_ms / 1000,
            hold_s=self.healthy_hold_ms / 1000,
        )

    def bands(self) -> dict[str, Band]:
        return {
            "runq_p99_us": Band(self.runq_p99_us_min, self.runq_p99_us_max),
            "runq_mean_us": Band(self.runq_mean_us_min, self.runq_mean_us_max),
            "retransmits_per_s": Band(self.retransmits_per_s_min, self.retransmits_per_s_max),
            "gpu_sync_wait_share": Band(self.gpu_sync_wait_share_max, self.gpu_sync_wait_share_max),
        }

    def calibrator(self) -> Calibrator:
        return Calibrator(
            self.bands(),
            ratio=self.baseline_ratio,
            sigmas=self.baseline_sigmas,
            min_samples=self.baseline_min_samples,
            capacity=self.baseline_capacity,
        )

    @property
    def kinds(self) -> list[str]:
        return [k.strip() for k in self.target_kinds.split(",") if k.strip()]

    @property
    def ports(self) -> list[int]:
        return [int(p) for p in self.tcp_ports.split(",") if p.strip()]
