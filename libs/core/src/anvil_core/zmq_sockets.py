"""The one place ZeroMQ sockets are made (STYLE rule 5): kind, bind or connect, identity, linger, HWM.

Sockets belong to the asyncio I/O tasks of their service; compute never touches them.
"""

from __future__ import annotations

import zmq
import zmq.asyncio

__all__ = ["make_socket", "tcp_endpoint"]


def make_socket(
    ctx: zmq.asyncio.Context,
    kind: int,
    *,
    bind: str | None = None,
    connect: str | None = None,
    identity: str | None = None,
    hwm: int = 10_000,
    linger_ms: int = 0,
    immediate: bool = False,
) -> zmq.asyncio.Socket:
    """Create a socket with Anvil's defaults.

    linger 0: a closing service never blocks on unsent messages (the peer answers by deadline).
    hwm 10k messages: bounded memory; queues above it are the admission controller's job.
    immediate: queue only to completed connections, so a send with no live peer fails at once
    (EAGAIN) instead of waiting for a peer that may never come.
    """
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    if kind == zmq.ROUTER:
        # An unknown identity is an error, not a silent drop: the sender learns the peer is gone.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    # Reconnect fast after a peer restarts (default 100 ms, cap 1 s).
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    if bind is not None:
        sock.bind(bind)
    if connect is not None:
        sock.connect(connect)
    return sock


def tcp_endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"
