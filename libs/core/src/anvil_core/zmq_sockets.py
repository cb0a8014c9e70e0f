"""The one place ZeroMQ sockets are made (STYLE rule 5): kind, bind or connect, identity, linger, HWM.

Sockets belong to the I/O tasks of their service; compute never touches them. CURVE (issue #18):
a socket made with a `CurveServer` is a CURVE server that fails every handshake unless a ZAP
handler (``anvil_core.zmq_auth.CurveGate``) admits the client's key; one made with a
`CurveClient` encrypts and talks only to the server holding the expected key.

On one host (`anvil up`) the links can instead use ipc sockets in a directory only the stack's user
can enter (0700, ``ANVIL_LINK_IPC_DIR``): the kernel admits only that user, nothing crosses a
network, and no byte is encrypted (CURVE costs ~1 ms of CPU per MB per hop; docs/security.md). The
scheduler binds those beside its CURVE tcp ports: libzmq takes a listener's security options when
it binds, so `plain_bind` endpoints are bound before the CURVE options are set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import zmq

from anvil_core.curve import CurveClient, CurveServer
from anvil_core.unix_link import unix_endpoint

__all__ = ["ipc_endpoint", "link_endpoint", "make_socket", "tcp_endpoint"]

_IPC_PATH_MAX = 107  # sun_path is 108 bytes on Linux, NUL included

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
    plain_bind: str | None = None,
    max_msg_bytes: int = -1,
) -> S:
    """Create a socket with Anvil's defaults (a sync or an asyncio one, as `ctx` is).

    linger 0: a closing service never blocks on unsent messages (the peer answers by deadline).
    hwm 10k messages: bounded memory; queues above it are the admission controller's job.
    immediate: queue only to completed connections, so a send with no live peer fails at once
    (EAGAIN) instead of waiting for a peer that may never come.
    curve: CURVE server or client options, applied before bind/connect (None: plain ZMTP).
    plain_bind: an endpoint bound before the CURVE options are set (an ipc path in a private dir).
    max_msg_bytes: a peer sending a larger message is disconnected before it is buffered (-1: no limit).
    """
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if max_msg_bytes >= 0:
        sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
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
    if plain_bind is not None:
        sock.bind(plain_bind)
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


def ipc_endpoint(ipc_dir: str, link: str) -> str:
    """The scheduler's ipc endpoint for `link` (gateway, executor) in `ipc_dir`; ValueError when
    the path does not fit a unix socket address."""
    path = str(Path(ipc_dir).resolve() / f"{link}.sock")
    if len(path.encode()) > _IPC_PATH_MAX:
        raise ValueError(
            f"ipc socket path longer than {_IPC_PATH_MAX} bytes: {path} (shorten ANVIL_LINK_IPC_DIR)"
        )
    return f"ipc://{path}"


def link_endpoint(ipc_dir: str, advertised: str, link: str, transport: str = "zmq") -> str:
    """Where a client of `link` connects: on one host (`ipc_dir` set) the scheduler's ipc ZeroMQ
    socket, or its Unix stream socket with `transport` "unix" (anvil_core.unix_link); else what the
    scheduler advertised in the registry (tcp, CURVE)."""
    if not ipc_dir:
        return advertised
    if transport == "unix":
        return unix_endpoint(ipc_dir, link)
    return ipc_endpoint(ipc_dir, link)
