"""TCP on the gateway's port(s): socket states, retransmits and unacknowledged bytes.

Tracepoints (all report ports in host byte order, and fire in any network namespace):
- `sock:inet_sock_set_state`: every TCP state change; the probe keeps the live state of each socket
  whose local port is watched (sockets that existed before attach are unknown until they change) and
  counts entries into each state (connects, closes, resets show up as rates);
- `tcp:tcp_retransmit_skb`, `tcp:tcp_retransmit_synack`: retransmitted segments / SYN-ACKs;
- `tcp:tcp_probe` (each ACK received on an established socket): snd_nxt - snd_una, the bytes sent but
  not yet acknowledged — the send queue growing when clients or the network cannot keep up.
Only the gateway's side counts (local port = watched port), so a client on the same host is not
counted twice.
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Iterable
from typing import Any

from anvil_qos.probes.bpf_loader import compile_program
from anvil_qos.samples import TCP_STATES, TcpSample

__all__ = ["TcpProbe"]

PROGRAM = r"""
#define IPPROTO_TCP_ 6
#define TCP_CLOSE_ 7

struct state_key { u16 port; u16 state; };

BPF_HASH(ports, u16, u8, 64);                          // watched local ports, written by user space
BPF_HASH(sockets, u64, struct state_key, 65536);       // socket address -> its port and state now
BPF_HASH(entered, struct state_key, u64, 64 * 16);     // entries into each state
BPF_HASH(retransmits, u16, u64, 64);
BPF_HASH(unacked_max, u16, u32, 64);                   // max bytes in flight since user space reset

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != IPPROTO_TCP_)
        return 0;
    u16 port = args->sport;
    if (!ports.lookup(&port))
        return 0;
    u64 sk = (u64)args->skaddr;
    struct state_key key = {.port = port, .state = (u16)args->newstate};
    entered.increment(key);
    if (args->newstate == TCP_CLOSE_)
        sockets.delete(&sk);
    else
        sockets.update(&sk, &key);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    u16 port = args->sport;
    if (ports.lookup(&port))
        retransmits.increment(port);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_synack) {
    u16 port = args->sport;
    if (ports.lookup(&port))
        retransmits.increment(port);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_probe) {
    u16 port = args->sport;
    if (!ports.lookup(&port))
        return 0;
    u32 inflight = args->snd_nxt - args->snd_una;
    u32 *seen = unacked_max.lookup(&port);
    if (!seen || *seen < inflight)
        unacked_max.update(&port, &inflight);
    return 0;
}
"""


class TcpProbe:
    """Owned by the eBPF observer. Not thread-safe: one caller at a time."""

    def __init__(self) -> None:
        self.bpf: Any = compile_program(PROGRAM)
        self._ports: set[int] = set()

    def set_ports(self, ports: Iterable[int]) -> None:
        wanted = {p for p in ports if 0 < p < 65536}
        table = self.bpf["ports"]
        for port in self._ports - wanted:
            del table[ct.c_uint16(port)]
        for port in wanted - self._ports:
            table[ct.c_uint16(port)] = ct.c_uint8(1)
        self._ports = wanted

    def read(self) -> list[TcpSample]:
        """Cumulative counters per port; resets the per-tick maximum of unacknowledged bytes."""
        live: dict[int, dict[str, int]] = {p: {} for p in self._ports}
        for _, v in self.bpf["sockets"].items():
            states = live.setdefault(int(v.port), {})
            name = TCP_STATES.get(int(v.state), str(int(v.state)))
            states[name] = states.get(name, 0) + 1
        entered: dict[int, dict[str, int]] = {p: {} for p in self._ports}
        for k, v in self.bpf["entered"].items():
            name = TCP_STATES.get(int(k.state), str(int(k.state)))
            entered.setdefault(int(k.port), {})[name] = int(v.value)
        retrans = {int(k.value): int(v.value) for k, v in self.bpf["retransmits"].items()}
        unacked_table = self.bpf["unacked_max"]
        unacked = {int(k.value): int(v.value) for k, v in unacked_table.items()}
        unacked_table.clear()
        return [
            TcpSample(
                port=port,
                states=live.get(port, {}),
                transitions=entered.get(port, {}),
                retransmits=retrans.get(port, 0),
                retransmits_scope="port",
                unacked_bytes_max=unacked.get(port, 0),
            )
            for port in sorted(self._ports)
        ]

    def close(self) -> None:
        self.bpf.cleanup()
