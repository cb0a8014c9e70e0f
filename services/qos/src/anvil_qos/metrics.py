"""qos's Prometheus metrics (served on ANVIL_METRICS_PORT, 8006 by default).

Every reading carries `mode` ("ebpf" or "procfs"), so a dashboard never mixes a /proc mean with an
eBPF p99 unknowingly. Label sets of targets that left are removed, so churn does not grow the series.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge

from anvil_qos.baseline import Baseline
from anvil_qos.policy import Decision
from anvil_qos.samples import Sample
from anvil_qos.signals import Measure

__all__ = ["Exporter"]

mode_gauge = Gauge("anvil_qos_mode", "1 for the active observation mode (ebpf or procfs)", ["mode"])
targets_gauge = Gauge("anvil_qos_targets", "Processes probed, by service kind", ["kind"])
measure_gauge = Gauge(
    "anvil_qos_measure",
    "Pressure measures over the signal window (see anvil_qos.signals for names and units)",
    ["name", "subject", "mode"],
)
runq_seconds = Gauge(
    "anvil_qos_runq_wait_seconds_total", "Run-queue wait of the process since probed", ["kind", "id", "mode"]
)
cpu_seconds = Gauge(
    "anvil_qos_cpu_seconds_total", "CPU time of the process since probed", ["kind", "id", "mode"]
)
tcp_sockets = Gauge("anvil_qos_tcp_sockets", "Gateway-port sockets by state", ["port", "state", "mode"])
tcp_retransmits = Gauge(
    "anvil_qos_tcp_retransmits_total", "Retransmitted segments since probed", ["port", "scope", "mode"]
)
gpu_launches = Gauge("anvil_qos_gpu_launches_total", "cuLaunchKernel* calls since probed", ["kind", "id"])
gpu_wait = Gauge(
    "anvil_qos_gpu_sync_wait_seconds_total", "Time blocked in cu*Synchronize since probed", ["kind", "id"]
)
idle_wake_seconds = Gauge(
    "anvil_qos_idle_wake_seconds_total",
    "Waits that ended on an idle CPU (its exit, not a queue; eBPF only), since probed",
    ["kind", "id"],
)
baseline_gauge = Gauge(
    "anvil_qos_baseline",
    "Learned calm level of a measure on this host (stat: median, mad, threshold, samples)",
    ["name", "subject", "stat"],
)
decisions_total = Counter("anvil_qos_decisions", "Throttling decisions", ["action", "cause"])
rate_gauge = Gauge(
    "anvil_qos_rate_rps", "Current limit qos sets, by tenant and priority", ["tenant", "priority"]
)


class Exporter:
    """Owned by the service loop: mirrors each tick's readings and decisions into the metrics."""

    def __init__(self) -> None:
        self._series: dict[Gauge, set[tuple[str, ...]]] = {}

    def _set(
        self, gauge: Gauge, labels: tuple[str, ...], value: float, seen: dict[Gauge, set[tuple[str, ...]]]
    ) -> None:
        gauge.labels(*labels).set(value)
        seen.setdefault(gauge, set()).add(labels)

    def observe(self, sample: Sample, measures: list[Measure], baselines: Sequence[Baseline] = ()) -> None:
        mode = sample.mode
        seen: dict[Gauge, set[tuple[str, ...]]] = {}
        kinds: dict[str, int] = {}
        for p in sample.processes:
            kinds[p.target.kind] = kinds.get(p.target.kind, 0) + 1
            ids = (p.target.kind, p.target.id, mode)
            self._set(runq_seconds, ids, p.runq_delay_ns / 1e9, seen)
            self._set(cpu_seconds, ids, p.cpu_ns / 1e9, seen)
            if mode == "ebpf":
                self._set(idle_wake_seconds, ids[:2], p.idle_wake_ns / 1e9, seen)
        for kind, n in kinds.items():
            self._set(targets_gauge, (kind,), n, seen)
        for t in sample.tcp:
            for state, n in t.states.items():
                self._set(tcp_sockets, (str(t.port), state, mode), n, seen)
            self._set(tcp_retransmits, (str(t.port), t.retransmits_scope, mode), t.retransmits, seen)
        for g in sample.gpu:
            self._set(gpu_launches, (g.target.kind, g.target.id), g.launches, seen)
            self._set(gpu_wait, (g.target.kind, g.target.id), g.sync_wait_ns / 1e9, seen)
        for m in measures:
            self._set(measure_gauge, (m.name, m.subject, mode), m.value, seen)
        for b in baselines:
            for stat, value in (("median", b.median), ("mad", b.mad), ("threshold", b.threshold)):
                self._set(baseline_gauge, (b.name, b.subject, stat), value, seen)
            self._set(baseline_gauge, (b.name, b.subject, "samples"), b.samples, seen)
        for gauge in (
            idle_wake_seconds,
            baseline_gauge,
            targets_gauge,
            runq_seconds,
            cpu_seconds,
            tcp_sockets,
            tcp_retransmits,
            gpu_launches,
            gpu_wait,
            measure_gauge,
        ):
            for labels in self._series.get(gauge, set()) - seen.get(gauge, set()):
                gauge.remove(*labels)
            self._series[gauge] = seen.get(gauge, set())

    @staticmethod
    def set_mode(mode: str) -> None:
        for m in ("ebpf", "procfs"):
            mode_gauge.labels(mode=m).set(1 if m == mode else 0)

    @staticmethod
    def decided(decision: Decision) -> None:
        decisions_total.labels(action=str(decision.action), cause=decision.cause).inc()
        if decision.key:
            tenant, _, prio = decision.key.rpartition(":")
            if decision.rate_rps > 0:
                rate_gauge.labels(tenant=tenant, priority=prio).set(decision.rate_rps)
            else:
                try:
                    rate_gauge.remove(tenant, prio)
                except KeyError:
                    pass
