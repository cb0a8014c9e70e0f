"""The Unix sockets this host's services serve each other beside the scheduler's links
(anvil_core.unix_link's framing, hello and peer check): a gateway's **answer socket**,
``answers-<gateway identity>.usock``, where executors write its requests' answers (direct answers),
and an executor's **direct socket**, ``direct-<executor id>.usock``, where a gateway sends a lone
request itself (direct requests; docs/scheduler.md). Paths are built only from plain identities,
inside the caller's own link directory, never from the wire."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anvil_core.unix_link import HELLO, PATH_MAX, encode, same_user, write_some

__all__ = ["BUSY", "AnswerSender", "answer_path", "direct_path", "is_answer_identity"]

# an executor's answer to a direct request it did not take (busy, or not a model it runs fast):
# ``[BUSY, request id]``; the gateway sends that request through the scheduler instead
BUSY = b"ANVIL-BUSY-1"

_IDENTITY = re.compile(r"[A-Za-z0-9._-]{1,64}")


def is_answer_identity(identity: str) -> bool:
    """Whether a gateway identity may name an answer socket: 1-64 of ``[A-Za-z0-9._-]`` (nothing
    that could name another path)."""
    return _IDENTITY.fullmatch(identity) is not None


def answer_path(ipc_dir: str, identity: str) -> str | None:
    """The answer socket of the gateway named `identity` in the link directory `ipc_dir` (direct
    answers: executors write a gateway's answers there, the scheduler only hears that they did), or
    None for an identity that ``is_answer_identity`` refuses or a path too long for a socket."""
    return _peer_path(ipc_dir, "answers", identity)


def direct_path(ipc_dir: str, identity: str) -> str | None:
    """The direct-request socket of the executor named `identity` in `ipc_dir` (a gateway sends a
    lone request there itself, docs/scheduler.md "Direct requests"), or None as for ``answer_path``."""
    return _peer_path(ipc_dir, "direct", identity)


def _peer_path(ipc_dir: str, kind: str, identity: str) -> str | None:
    if not is_answer_identity(identity):
        return None
    path = str(Path(ipc_dir) / f"{kind}-{identity}.usock")
    return path if len(path.encode()) <= PATH_MAX else None


class AnswerSender:
    """An executor's connections to the answer sockets of this host's gateways (direct answers,
    docs/scheduler.md). ``send`` writes one message to the gateway named `identity` from the calling
    thread (a compute lane, or the I/O loop for an inline batch): blocking, at most ``timeout_s``,
    whole or not at all. False means the answer did not go (no such socket, a peer of another user,
    a gateway gone or not reading): the caller sends it through the scheduler instead; a connection
    that failed mid-message is closed (the gateway drops the partial message with it), and that
    gateway is not tried again for ``retry_s``. Thread-safe: one lock per connection."""

    def __init__(self, ipc_dir: str, identity: str, timeout_s: float = 0.05, retry_s: float = 1.0) -> None:
        self.ipc_dir = ipc_dir
        self.identity = identity.encode()
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._lock = threading.Lock()  # guards the two dicts
        self._conns: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self._retry_at: dict[str, float] = {}
        self.sent = 0  # messages written whole
        self.failed = 0  # messages that did not go (the scheduler carried them)

    def send(self, identity: str, parts: Sequence[Any]) -> bool:
        conn = self._conn(identity)
        if conn is None:
            self.failed += 1
            return False
        sock, lock = conn
        bufs = [memoryview(b).cast("B") for b in encode(parts)]
        with lock:
            try:
                while bufs:
                    write_some(sock, bufs)
            except OSError:  # gone, not reading (timeout), or refused: maybe half-written
                self._drop(identity, sock)
                self.failed += 1
                return False
        self.sent += 1
        return True

    def _conn(self, identity: str) -> tuple[socket.socket, threading.Lock] | None:
        """The connection to `identity`'s answer socket: made on first use (outside the lock, so
        that a slow connect holds up no other gateway's answers), None while it cannot be."""
        with self._lock:
            conn = self._conns.get(identity)
            if conn is not None:
                return conn
            if time.monotonic() < self._retry_at.get(identity, 0.0):
                return None
        path = answer_path(self.ipc_dir, identity)
        if path is None:
            return None
        sock = self._connect(path)
        with self._lock:
            if sock is None:
                self._retry_at[identity] = time.monotonic() + self.retry_s
                return None
            conn = self._conns.get(identity)
            if conn is not None:  # another thread connected meanwhile: keep one connection
                sock.close()
                return conn
            conn = self._conns[identity] = (sock, threading.Lock())
            return conn

    def _connect(self, path: str) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(path)
            if not same_user(sock):
                raise PermissionError(f"{path}: served by another user")
            sock.sendall(b"".join(bytes(b) for b in encode([HELLO, self.identity])))
        except OSError:
            sock.close()
            return None
        return sock

    def _drop(self, identity: str, sock: socket.socket) -> None:
        with self._lock:
            if self._conns.get(identity, (None,))[0] is sock:
                del self._conns[identity]
            self._retry_at[identity] = time.monotonic() + self.retry_s
        sock.close()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for sock, _ in conns:
            sock.close()
