"""What an observer reports each tick: cumulative counters per process, per port and per GPU process.

Counters are cumulative since the observer started watching that subject (like /proc and Prometheus
counters); `signals.PressureMeter` turns two readings into one interval's rates and percentiles.
Both observers (eBPF and /proc) fill the same types; fields one of them cannot measure say so
(`runq_hist=None`, `retransmits_scope="netns"`) rather than faking a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from anvil_qos.hist import Log2Histogram
from anvil_qos.targets import Target

__all__ = ["TCP_STATES", "GpuSample", "ProcessSample", "Sample", "TcpSample"]

# Linux's TCP state numbers (include/net/tcp_states.h), as tracepoints and /proc/net/tcp report them.
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}


@dataclass(frozen=True)
class ProcessSample:
    target: Target
    cpu_ns: int  # on-CPU time of all its threads
    runq_delay_ns: int  # time its threads spent runnable but waiting for a CPU
    runq_events: int  # eBPF: waits measured; /proc: timeslices run (schedstat field 3)
    runq_hist: Log2Histogram | None  # µs per wait; None where only sums exist (/proc)
    # eBPF only: waits that ended on an idle CPU (its exit path, not a queue; charged 0 above, as the
    # kernel's schedstat does) and their total length. 0 under /proc (schedstat cannot tell them apart).
    idle_wake_ns: int = 0
    idle_wakes: int = 0


@dataclass(frozen=True)
class TcpSample:
    port: int  # local port of the gateway's sockets
    states: Mapping[str, int]  # live sockets by state (eBPF: those that changed state since attach)
    transitions: Mapping[str, int]  # entries into each state (eBPF only; empty under /proc)
    retransmits: int  # segments retransmitted
    retransmits_scope: str  # "port" (eBPF) or "netns" (/proc/net/snmp: every port of the namespace)
    unacked_bytes_max: int  # eBPF: max snd_nxt - snd_una seen this tick; /proc: sum of tx_queue now


@dataclass(frozen=True)
class GpuSample:
    target: Target
    launches: int  # cuLaunchKernel* calls
    syncs: int  # cuStreamSynchronize / cuEventSynchronize / cuCtxSynchronize calls returned
    sync_wait_ns: int  # time spent inside them


@dataclass(frozen=True)
class Sample:
    mode: str  # "ebpf" or "procfs"
    ts: float  # monotonic s at the reading
    processes: tuple[ProcessSample, ...] = ()
    tcp: tuple[TcpSample, ...] = ()
    gpu: tuple[GpuSample, ...] = ()
    notes: tuple[str, ...] = field(default=())  # what this observer cannot see, and why
