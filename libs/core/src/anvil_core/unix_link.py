"""Same-host links over Unix stream sockets (issue #19): the gateway <-> scheduler and scheduler <->
executor links of one host without ZeroMQ's I/O threads.

Why: a ZeroMQ message wakes four threads (the sender's loop, its I/O thread, the receiver's I/O
thread, the receiver's loop); a lone request makes four messages. One round trip between two
sleeping processes measured 166 µs over ZeroMQ ipc against 24 µs over an asyncio Unix socket
(bench/results/link_latency.md). Here the sender's loop writes into the socket and the receiver's
loop reads it: one wake-up per message.

Trust: the socket file lives in the run's link directory (0700, made by the scheduler) and is
created 0600; every accepted connection's peer must run as this user (``SO_PEERCRED``), else it is
closed before a byte is read. Nothing on it is encrypted (it never leaves the host), as for the ipc
ZeroMQ links it replaces.

Wire: a connection starts with the client's hello, the message ``[b"ANVIL-LINK-1", identity]``;
then each message is ``u32 frame count`` and, per frame, ``u32 length`` and its bytes (little
endian), as ZeroMQ's multipart messages are. Limits: ``MAX_FRAMES`` frames and ``max_msg_bytes`` a
message; a peer that breaks them is disconnected (``LinkError``), as ZeroMQ's MAXMSGSIZE does.

The scheduler's side is ``UnixRouter`` (a ROUTER's subset: messages in as (identity, frames), out by
identity), the executor's ``UnixDealer`` (a blocking-loop DEALER's subset, reconnecting by itself)
and the gateway's asyncio client is ``anvil_gateway.backend.UnixSchedulerLink``. The sockets peers
serve each other beside the scheduler's (gateways' answer sockets, executors' direct sockets) are
in ``anvil_core.unix_peers``.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HELLO",
    "MAX_FRAMES",
    "Conn",
    "FrameReader",
    "LinkError",
    "PolledFds",
    "UnixDealer",
    "UnixRouter",
    "encode",
    "is_unix_endpoint",
    "same_user",
    "unix_endpoint",
    "unix_path",
    "write_some",
]

HELLO = b"ANVIL-LINK-1"
MAX_FRAMES = 4096
DEFAULT_MAX_MSG_BYTES = 1 << 30  # a bundle of 8 requests at the gateway's 64 MiB body cap fits
MAX_QUEUED_BYTES = 256 << 20  # unsent bytes a peer may leave behind before it is cut off
_U32 = struct.Struct("<I")
_SCHEME = "unix://"
PATH_MAX = 107  # sun_path holds 108 bytes with its terminating NUL


class LinkError(Exception):
    """A peer broke the wire format or its limits; the connection is closed."""


def unix_endpoint(ipc_dir: str, link: str) -> str:
    """The scheduler's Unix-socket endpoint for `link` (gateway, executor) in `ipc_dir`."""
    path = str(Path(ipc_dir).resolve() / f"{link}.usock")
    if len(path.encode()) > PATH_MAX:
        raise ValueError(
            f"unix socket path longer than {PATH_MAX} bytes: {path} (shorten ANVIL_LINK_IPC_DIR)"
        )
    return _SCHEME + path


def is_unix_endpoint(endpoint: str) -> bool:
    return endpoint.startswith(_SCHEME)


def unix_path(endpoint: str) -> str:
    if not is_unix_endpoint(endpoint):
        raise ValueError(f"not a unix link endpoint: {endpoint!r}")
    return endpoint[len(_SCHEME) :]


def encode(parts: Sequence[Any]) -> list[Any]:
    """The buffers of one message (header first), for ``sendmsg``/``writelines`` without copying
    the frames."""
    views = [p.buffer if hasattr(p, "buffer") else p for p in parts]  # a zmq.Frame's bytes
    head = bytearray(_U32.pack(len(views)))
    for v in views:
        head += _U32.pack(memoryview(v).nbytes)
    return [bytes(head), *views]


def write_some(sock: socket.socket, bufs: list[memoryview]) -> None:
    """One ``sendmsg`` of (the first 512 of) `bufs`; what the socket took is removed from `bufs`
    (the first one left may now be a tail of itself). Raises what ``sendmsg`` raises."""
    sent = sock.sendmsg(bufs[:512])
    while sent:
        head = bufs[0]
        if sent >= head.nbytes:
            sent -= head.nbytes
            bufs.pop(0)
        else:
            bufs[0] = head[sent:]
            sent = 0


class FrameReader:
    """Cuts the byte stream of one connection into messages (lists of ``bytes``)."""

    def __init__(self, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES) -> None:
        self.max_msg_bytes = max_msg_bytes
        self._buf = bytearray()
        self._pos = 0
        self.broken: LinkError | None = None  # the peer broke the format; nothing more is read

    def feed(self, data: bytes | bytearray | memoryview) -> list[list[bytes]]:
        """The complete messages ``data`` ends. Messages before a malformed one are returned and the
        error kept in ``broken``: a caller handles them, then sees ``broken``; the next ``feed``
        raises it. With none before it, the LinkError is raised at once."""
        if self.broken is not None:
            raise self.broken
        self._buf += data
        out: list[list[bytes]] = []
        try:
            while (msg := self._next()) is not None:
                out.append(msg)
        except LinkError as exc:
            self.broken = exc
            if not out:
                raise
        finally:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
        return out

    def _next(self) -> list[bytes] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (count,) = _U32.unpack_from(buf, pos)
        if count == 0 or count > MAX_FRAMES:
            raise LinkError(f"a message of {count} frames (1..{MAX_FRAMES})")
        head_end = pos + 4 + 4 * count
        if len(buf) < head_end:
            return None
        sizes = [_U32.unpack_from(buf, pos + 4 + 4 * i)[0] for i in range(count)]
        total = sum(sizes)
        if total > self.max_msg_bytes:
            raise LinkError(f"a message of {total} bytes; at most {self.max_msg_bytes}")
        if len(buf) < head_end + total:
            return None
        frames, at = [], head_end
        for size in sizes:
            frames.append(bytes(buf[at : at + size]))
            at += size
        self._pos = at
        return frames


def same_user(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


class Conn:
    """One nonblocking connection carrying multipart messages; what a send cannot write at once
    waits in order and leaves on ``flush`` (the owner polls for writability while ``wants_write``)."""

    def __init__(self, sock: socket.socket, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.reader = FrameReader(max_msg_bytes)
        self._out: list[memoryview] = []
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def read(self) -> list[list[bytes]]:
        """Every complete message readable now; raises ConnectionError at EOF or a socket error,
        LinkError when the peer broke the format."""
        out: list[list[bytes]] = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return out
            except InterruptedError:
                continue
            if not data:
                if out:
                    return out  # the messages before the EOF still count; the next read reports it
                raise ConnectionResetError("peer closed the link")
            out += self.reader.feed(data)
            if self.reader.broken is not None:
                return out  # the messages before the malformed one count; the next read raises

    def send(self, parts: Sequence[Any]) -> None:
        """Queue one message and write what the socket takes now; raises ConnectionError when the
        peer is gone, or has left ``MAX_QUEUED_BYTES`` unread (a stalled peer costs bounded memory:
        at most that plus one message; it is disconnected and reconnects)."""
        bufs = [memoryview(b).cast("B") for b in encode(parts)]
        if self._out:
            queued = sum(b.nbytes for b in self._out)
            if queued >= MAX_QUEUED_BYTES:
                raise ConnectionAbortedError(f"peer not reading: {queued} bytes unsent")
            self._out += bufs
            return
        self._out = bufs
        self.flush()

    def flush(self) -> None:
        while self._out:
            try:
                write_some(self.sock, self._out)
            except BlockingIOError:
                return
            except InterruptedError:
                continue

    def close(self) -> None:
        self.closed = True
        self._out = []
        try:
            self.sock.close()
        except OSError:
            pass


class UnixRouter:
    """The scheduler's listening side of one link: accepts this user's connections, names each by
    its hello's identity (a newer connection with the same identity replaces the older one, as a
    restarted peer's does), and routes messages by identity. Driven by a ``zmq.Poller``: register
    ``poll_items()`` after every ``on_events``."""

    def __init__(self, path: str, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES) -> None:
        self.path = path
        self.max_msg_bytes = max_msg_bytes
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a socket file left by a killed scheduler
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(path)  # created 0600
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.conns: dict[bytes, Conn] = {}  # identity -> its connection
        self._fresh: dict[int, Conn] = {}  # fd -> accepted, no hello yet
        self._named: dict[int, bytes] = {}  # fd -> identity of each connection in `conns`
        self.refused = 0  # connections of another user, closed unread
        # identities whose connection ended (EOF, error, cut off), not replaced by a newer one: the
        # owner takes them (`take_lost`), e.g. to re-dispatch a dead executor's work at once
        self.lost: list[bytes] = []

    def fds(self) -> list[tuple[int, bool]]:
        """(fd, wants write) of the listener and of every connection, for the poller."""
        items = [(self.listener.fileno(), False)]
        items += [(c.fileno(), False) for c in self._fresh.values()]
        items += [(c.fileno(), c.wants_write) for c in self.conns.values()]
        return items

    def on_ready(
        self, fd: int, writable: bool = False
    ) -> tuple[list[tuple[bytes, list[bytes]]], list[tuple[str, str]]]:
        """Serve one ready fd: accepted connections, the messages read (identity, frames), and what
        happened on the way as (reason, detail): reason "closed" for a peer that went away, else a
        ``codec.REASONS`` label for a refused peer or message (the link itself goes on)."""
        problems: list[tuple[str, str]] = []
        if fd == self.listener.fileno():
            self._accept(problems)
            return [], problems
        fresh = self._fresh.get(fd)
        if fresh is not None:
            return self._hello(fd, fresh, problems), problems
        ident = self._named.get(fd)
        if ident is None:
            return [], problems
        conn = self.conns[ident]
        try:
            if writable:
                conn.flush()
            return [(ident, msg) for msg in conn.read()], problems
        except (OSError, LinkError) as exc:
            reason = "invalid" if isinstance(exc, LinkError) else "closed"
            problems.append((reason, f"link {ident!r} closed: {exc}"))
            self._drop(ident)
            return [], problems

    def owns(self, fd: int) -> bool:
        """Whether ``fd`` is this router's (its listener or one of its connections)."""
        return fd == self.listener.fileno() or fd in self._fresh or fd in self._named

    def _drop(self, ident: bytes) -> None:
        """The connection named ``ident`` ended (EOF, error, cut off): closed, and reported lost."""
        conn = self.conns.pop(ident)
        self._named.pop(conn.fileno(), None)
        conn.close()
        self.lost.append(ident)

    def _accept(self, problems: list[tuple[str, str]]) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if not same_user(sock):
                self.refused += 1
                problems.append(("unexpected", "refused a link connection from another user"))
                sock.close()
                continue
            conn = Conn(sock, self.max_msg_bytes)
            self._fresh[conn.fileno()] = conn

    def _hello(self, fd: int, conn: Conn, problems: list[tuple[str, str]]) -> list[tuple[bytes, list[bytes]]]:
        try:
            msgs = conn.read()
        except (OSError, LinkError) as exc:
            problems.append(
                (
                    "invalid" if isinstance(exc, LinkError) else "closed",
                    f"link closed before its hello: {exc}",
                )
            )
            conn.close()
            del self._fresh[fd]
            return []
        if not msgs:
            return []
        hello, rest = msgs[0], msgs[1:]
        if len(hello) != 2 or hello[0] != HELLO or not 0 < len(hello[1]) <= 255:
            problems.append(("invalid", "link closed: its first message is not a hello with an identity"))
            conn.close()
            del self._fresh[fd]
            return []
        ident = hello[1]
        del self._fresh[fd]
        old = self.conns.pop(ident, None)
        if old is not None:  # the peer reconnected (restarted): the newer connection is the one
            self._named.pop(old.fileno(), None)
            old.close()
        self.conns[ident] = conn
        self._named[fd] = ident
        return [(ident, msg) for msg in rest]

    def send(self, ident: bytes, parts: Sequence[Any]) -> bool:
        """Send to the connection named ``ident``; False when there is none (or it just failed)."""
        conn = self.conns.get(ident)
        if conn is None:
            return False
        try:
            conn.send(parts)
            return True
        except OSError:
            self._drop(ident)
            return False

    def take_lost(self) -> list[bytes]:
        lost, self.lost = self.lost, []
        return lost

    def close(self) -> None:
        for conn in [*self.conns.values(), *self._fresh.values()]:
            conn.close()
        self.conns.clear()
        self._fresh.clear()
        self._named.clear()
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class PolledFds:
    """Keeps a ``zmq.Poller``'s registrations in step with routers' fds (new connections, gone ones,
    and whether each has bytes waiting to be written), touching the poller only on a change."""

    def __init__(self, pollin: int, pollout: int) -> None:
        self._in, self._inout = pollin, pollin | pollout  # zmq's flags as plain ints (enum.Flag is slow)
        self._polled: dict[int, int] = {}  # fd -> the flags it is registered with

    def watch(self, poller: Any, *routers: UnixRouter) -> None:
        want: dict[int, int] = {}
        for router in routers:
            for fd, wants_write in router.fds():
                want[fd] = self._inout if wants_write else self._in
        if want == self._polled:
            return
        for fd in self._polled.keys() - want.keys():
            poller.unregister(fd)
        for fd, flags in want.items():
            if self._polled.get(fd) != flags:
                poller.register(fd, flags)  # registers, or modifies a registered fd
        self._polled = want


class UnixDealer:
    """The executor's side of its link, for a blocking poll loop: ``send`` writes now (or raises
    ``ConnectionError`` while there is no link); the owner polls ``fileno()`` (a pipe that never
    fires while unconnected) and calls ``read`` when it is ready, and ``tick`` every loop turn,
    which reconnects after a loss (every ``retry_s``) and flushes what waits."""

    def __init__(
        self, identity: str, retry_s: float = 0.1, max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    ) -> None:
        self.identity = identity.encode()
        self.retry_s = retry_s
        self.max_msg_bytes = max_msg_bytes
        self.path: str | None = None
        self.conn: Conn | None = None
        self._next_try = 0.0
        self._idle_r, self._idle_w = os.pipe()  # polled while there is no connection
        self.connects = 0  # connections made (the first and every reconnect)

    def follow(self, endpoint: str) -> None:
        self.path = unix_path(endpoint)
        self._drop()
        self._next_try = 0.0
        self.tick()

    def fileno(self) -> int:
        return self.conn.fileno() if self.conn is not None else self._idle_r

    @property
    def connected(self) -> bool:
        return self.conn is not None

    @property
    def wants_write(self) -> bool:
        return self.conn is not None and self.conn.wants_write

    def tick(self) -> bool:
        """Reconnect when due; True when a new connection was made this call (say hello again)."""
        if self.conn is not None:
            try:
                self.conn.flush()
            except OSError:
                self._drop()
            return False
        if self.path is None or time.monotonic() < self._next_try:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self._next_try = time.monotonic() + self.retry_s
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN):
                raise
            return False
        self.conn = Conn(sock, self.max_msg_bytes)
        self.conn.send([HELLO, self.identity])
        self.connects += 1
        return True

    def send(self, parts: Sequence[Any]) -> None:
        if self.conn is None:
            raise ConnectionError("no link to the scheduler")
        try:
            self.conn.send(parts)
        except OSError:
            self._drop()
            raise

    def read(self) -> list[list[bytes]]:
        """Messages readable now; a lost link is dropped here (``tick`` makes the next one)."""
        if self.conn is None:
            return []
        try:
            return self.conn.read()
        except (OSError, LinkError):
            self._drop()
            return []

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            self._next_try = time.monotonic() + self.retry_s

    def close(self) -> None:
        self._drop()
        for fd in (self._idle_r, self._idle_w):
            try:
                os.close(fd)
            except OSError:
                pass
