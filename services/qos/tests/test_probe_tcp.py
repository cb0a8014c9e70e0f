"""The TCP probe on a listening port: connection states, transitions, unacknowledged bytes — and the
/proc twin sees the same sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from anvil_qos.procfs import read_tcp


@pytest.fixture
def server() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    yield srv
    srv.close()


def test_states_and_transitions_of_the_gateway_port(ebpf: None, server: socket.socket) -> None:
    from anvil_qos.probes.tcp import TcpProbe

    port = server.getsockname()[1]
    probe = TcpProbe()
    try:
        probe.set_ports([port])
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        accepted = [server.accept()[0] for _ in clients]
        # The client does not read: bytes pile up unacknowledged only once its window is full, so
        # send enough for acks to flow while data is still in flight.
        for conn in accepted:
            conn.setblocking(False)
            try:
                conn.send(b"x" * 4_000_000)
            except BlockingIOError:
                pass
        time.sleep(0.1)
        (tcp,) = probe.read()
        assert tcp.port == port and tcp.retransmits_scope == "port"
        assert tcp.states == {"ESTABLISHED": 4}
        assert tcp.transitions == {"SYN_RECV": 4, "ESTABLISHED": 4}
        assert tcp.unacked_bytes_max > 0
        assert read_tcp(port).states == {"LISTEN": 1, "ESTABLISHED": 4}  # /proc also sees LISTEN

        for c in clients[:2]:  # the client closes first: the gateway's side passes CLOSE_WAIT
            c.shutdown(socket.SHUT_RDWR)
            c.close()
        time.sleep(0.1)
        (tcp,) = probe.read()
        assert tcp.states.get("ESTABLISHED") == 2
        assert tcp.transitions.get("CLOSE", 0) + tcp.transitions.get("CLOSE_WAIT", 0) >= 2
        for conn in accepted + clients[2:]:
            conn.close()
    finally:
        probe.close()
