"""The /proc observer: what qos can still see where eBPF cannot load (not root, no tracefs, no bcc...).

- run-queue delay and CPU time: /proc/<pid>/task/<tid>/schedstat, summed over threads — field 1 is
  on-CPU ns, field 2 the run-queue wait ns (what the eBPF probe measures, as a sum only: no
  distribution, so the policy uses the mean wait per timeslice instead of a p99), field 3 timeslices;
- TCP: /proc/<pid>/net/tcp{,6} of the gateway (its network namespace): sockets of the port by state,
  tx_queue bytes; retransmits only namespace-wide (/proc/<pid>/net/snmp `Tcp: RetransSegs`);
- GPU: nothing (no uprobes without eBPF).
Every reading is labelled mode=procfs, and the measures it cannot take are named in `notes`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from anvil_qos.samples import TCP_STATES, ProcessSample, Sample, TcpSample
from anvil_qos.targets import Target

__all__ = ["ProcfsObserver", "read_schedstat", "read_tcp"]

PROC = Path("/proc")
NOTES = (
    "run-queue delay from /proc schedstat sums: mean per timeslice, no distribution",
    "TCP retransmits counted for the whole network namespace, not the port",
    "GPU probe off: uprobes need eBPF",
)


def read_schedstat(pid: int, proc: Path = PROC) -> dict[int, tuple[int, int, int]] | None:
    """tid -> (on-CPU ns, run-queue wait ns, timeslices) for the live threads of `pid`; None if gone."""
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    out = {}
    for task in tasks:
        try:
            cpu, wait, slices = (int(f) for f in (task / "schedstat").read_text().split()[:3])
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (cpu, wait, slices)
    return out


def read_tcp(port: int, pid: int | None = None, proc: Path = PROC) -> TcpSample:
    """The sockets whose local port is `port`, in the network namespace of `pid` (qos's own if None)."""
    net = proc / (str(pid) if pid else "self") / "net"
    states: dict[str, int] = {}
    tx_queue = 0
    for name in ("tcp", "tcp6"):
        try:
            lines = (net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue ...   (addresses "HEXIP:HEXPORT")
            fields = line.split()
            if len(fields) < 5 or int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            state = TCP_STATES.get(int(fields[3], 16), fields[3])
            states[state] = states.get(state, 0) + 1
            tx_queue += int(fields[4].split(":")[0], 16)
    return TcpSample(
        port=port,
        states=states,
        transitions={},
        retransmits=_retrans_segs(net / "snmp"),
        retransmits_scope="netns",
        unacked_bytes_max=tx_queue,
    )


def _retrans_segs(snmp: Path) -> int:
    try:
        tcp_lines = [ln.split() for ln in snmp.read_text().splitlines() if ln.startswith("Tcp:")]
    except OSError:
        return 0
    if len(tcp_lines) < 2 or "RetransSegs" not in tcp_lines[0]:
        return 0
    return int(tcp_lines[1][tcp_lines[0].index("RetransSegs")])


class ProcfsObserver:
    """Implements `observer.Observer` from /proc. Readings are cumulative since a target was added."""

    mode = "procfs"

    def __init__(self, reason: str, proc: Path = PROC) -> None:
        self.reason = reason  # why eBPF is off
        self.notes = NOTES
        self._proc = proc
        self._targets: list[Target] = []
        self._ports: dict[int, int | None] = {}  # port -> pid whose netns holds it
        # Per target pid: the threads' last readings, and what threads that exited had accumulated,
        # so the process total never steps down when a thread ends.
        self._threads: dict[int, dict[int, tuple[int, int, int]]] = {}
        self._exited: dict[int, list[int]] = {}
        self._base: dict[int, list[int]] = {}  # totals when the target was first seen

    def set_targets(self, targets: Sequence[Target], ports: Iterable[int]) -> None:
        self._targets = list(targets)
        gateways = {t.port: t.pid for t in targets if t.port}
        self._ports = {p: gateways.get(p) for p in set(ports) | set(gateways)}
        for pid in set(self._base) - {t.pid for t in targets}:
            self._threads.pop(pid, None)
            self._exited.pop(pid, None)
            self._base.pop(pid, None)

    def _totals(self, pid: int) -> list[int] | None:
        threads = read_schedstat(pid, self._proc)
        if threads is None:
            return None
        exited = self._exited.setdefault(pid, [0, 0, 0])
        for tid, last in self._threads.get(pid, {}).items():
            if tid not in threads:
                exited[:] = [e + v for e, v in zip(exited, last, strict=True)]
        self._threads[pid] = threads
        return [exited[i] + sum(t[i] for t in threads.values()) for i in range(3)]

    def sample(self) -> Sample:
        procs = []
        for target in self._targets:
            totals = self._totals(target.pid)
            if totals is None:
                continue
            base = self._base.setdefault(target.pid, totals)
            cpu, wait, slices = (n - b for n, b in zip(totals, base, strict=True))
            procs.append(ProcessSample(target, cpu, wait, slices, runq_hist=None))
        tcp = tuple(read_tcp(port, pid, self._proc) for port, pid in sorted(self._ports.items()))
        return Sample("procfs", time.monotonic(), tuple(procs), tcp, (), self.notes)

    def close(self) -> None:
        pass
