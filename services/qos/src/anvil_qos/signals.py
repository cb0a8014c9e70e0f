"""From cumulative readings to pressure measures over a sliding window (pure; no I/O).

Each tick the service feeds the observer's `Sample`; `PressureMeter.update` compares it with the
oldest reading still inside the window and returns one `Measure` per subject and quantity:

| name | subject | meaning | source |
|---|---|---|---|
| runq_p99_us | kind:id | p99 run-queue wait of the process's threads, µs | eBPF histogram |
| runq_mean_us | kind:id | mean run-queue wait per timeslice, µs | eBPF sums; /proc schedstat |
| cpu_cores | kind:id | CPU time / wall time (1.0 = one core busy) | both |
| retransmits_per_s | port:N | TCP retransmits on the gateway port (/proc: whole netns) | both |
| unacked_bytes | port:N | eBPF: max bytes in flight seen; /proc: tx_queue sum now | both |
| gpu_launches_per_s | kind:id | cuLaunchKernel* calls per s | eBPF uprobes |
| gpu_sync_wait_share | kind:id | time blocked in cu*Synchronize / wall time | eBPF uprobes |

Measures from too few events (an idle process) are left out rather than reported as noise.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from anvil_qos.hist import Log2Histogram
from anvil_qos.samples import Sample

__all__ = ["Measure", "PressureMeter"]


@dataclass(frozen=True)
class Measure:
    name: str  # see the table above
    subject: str  # "executor:exec-1", "port:8000"
    value: float


class PressureMeter:
    """Owned by the service loop; single-threaded."""

    def __init__(self, window_s: float, min_events: int = 20) -> None:
        assert window_s > 0
        self.window_s = window_s
        self.min_events = min_events  # fewer run-queue waits than this in a window: no runq measure
        self._history: deque[Sample] = deque()

    def update(self, sample: Sample) -> list[Measure]:
        self._history.append(sample)
        while len(self._history) > 2 and sample.ts - self._history[1].ts >= self.window_s:
            self._history.popleft()
        old = self._history[0]
        dt = sample.ts - old.ts
        if dt <= 0:
            return []
        return [*self._processes(old, sample, dt), *self._tcp(old, sample, dt), *self._gpu(old, sample, dt)]

    def _processes(self, old: Sample, new: Sample, dt: float) -> list[Measure]:
        before = {p.target: p for p in old.processes}
        out = []
        for p in new.processes:
            q = before.get(p.target)
            if q is None:
                continue
            subject = f"{p.target.kind}:{p.target.id}"
            out.append(Measure("cpu_cores", subject, max(0, p.cpu_ns - q.cpu_ns) / 1e9 / dt))
            waits = p.runq_events - q.runq_events
            if waits < self.min_events:
                continue
            if p.runq_hist is not None:
                hist = p.runq_hist.delta(q.runq_hist or Log2Histogram())
                out.append(Measure("runq_p99_us", subject, hist.percentile_us(0.99)))
            # The eBPF sums are charged as schedstat's (samples.py), so the mean means the same in
            # both modes; under eBPF it backs the p99 up (a hog moves the mean 50-500x, the p99 less).
            out.append(Measure("runq_mean_us", subject, (p.runq_delay_ns - q.runq_delay_ns) / waits / 1e3))
        return out

    @staticmethod
    def _tcp(old: Sample, new: Sample, dt: float) -> list[Measure]:
        before = {t.port: t for t in old.tcp}
        out = []
        for t in new.tcp:
            subject = f"port:{t.port}"
            out.append(Measure("unacked_bytes", subject, float(t.unacked_bytes_max)))
            q = before.get(t.port)
            if q is not None:
                out.append(Measure("retransmits_per_s", subject, max(0, t.retransmits - q.retransmits) / dt))
        return out

    @staticmethod
    def _gpu(old: Sample, new: Sample, dt: float) -> list[Measure]:
        before = {g.target: g for g in old.gpu}
        out = []
        for g in new.gpu:
            q = before.get(g.target)
            if q is None:
                continue
            subject = f"{g.target.kind}:{g.target.id}"
            out.append(Measure("gpu_launches_per_s", subject, (g.launches - q.launches) / dt))
            out.append(Measure("gpu_sync_wait_share", subject, (g.sync_wait_ns - q.sync_wait_ns) / 1e9 / dt))
        return out
