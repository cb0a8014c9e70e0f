"""The one place ZeroMQ sockets are made (STYLE rule 5): kind, bind or connect, identity, linger, HWM.

Sockets belong to the I/O tasks of their service; compute never touches them. CURVE (issue #18):
a socket made with a `CurveServer` is a CURVE server that fails every handshake unless a ZAP
handler (``anvil_core.zmq_auth.CurveGate``) admits the client's key; one made with a
`CurveClient` encrypts and talks only to the server holding the expected key.
"""

from __future__ import annotations

from typing import Any, TypeVar

import zmq

from anvil_core.curve import CurveClient, CurveServer

__all__ = ["make_socket", "tcp_endpoint"]

S = TypeVar("S", bound="zmq.Socket[Any]")


def make_socket(
    ctx: zmq.Context[S],
    kind: int,
    *,
    bind: str | None = None,
    connect: str | None = None,
    identity: str | None = None,
    hwm: int = 10_000,
    linger_ms: int = 0,
    immediate: bool = False,
    curve: CurveServer | CurveClient | None = None,
) -> S:
    """Create a socket with Anvil's defaults (a sync or an asyncio one, as `ctx` is).

    linger 0: a closing service never blocks on unsent messages (the peer answers by deadline).
    hwm 10k messages: bounded memory; queues above it are the admission controller's job.
    immediate: queue only to completed connections, so a send with no live peer fails at once
    (EAGAIN) instead of waiting for a peer that may never come.
    curve: CURVE server or client options, applied before bind/connect (None: plain ZMTP).
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
    if isinstance(curve, CurveServer):
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
        sock.setsockopt(zmq.ZAP_DOMAIN, curve.domain.encode())
        # fail closed: without a ZAP handler libzmq would admit any client that knows the server key
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    elif isinstance(curve, CurveClient):
        sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, zmq.curve_public(curve.secret_key))
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
    if bind is not None:
        sock.bind(bind)
    if connect is not None:
        sock.connect(connect)
    return sock


def tcp_endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"
