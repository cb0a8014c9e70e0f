"""A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator's transport.

httpx costs ~150 µs of CPU per request in Python; this costs a fraction of that, which keeps the
generator off the critical path at ~2k req/s on two cores. It speaks only what the benchmark needs:
one request at a time per connection, Content-Length or chunked responses.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Conn", "Endpoint", "HttpError", "Pool", "Response", "parse_head", "request_head"]


class HttpError(Exception):
    """The connection failed or the peer spoke something that is not HTTP/1.1."""


def request_head(
    host: str, port: int, target: str, extra: Iterable[tuple[str, str]], length: int, method: str = "POST"
) -> bytes:
    """A request's head (ending in CRLF CRLF) for `method target`, with Host, `extra` and
    Content-Length: what goes before a body of `length` bytes."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in extra]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """(status, headers with lower-case names) of a response head (its status line and header
    lines; a trailing blank line is ignored). ValueError when it is not HTTP/1.x: no HTTP/1.x status
    line with a three-digit code, or a header line without a colon."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"a header line without a colon: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(code), headers


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only http://host:port URLs are supported, got {url!r}")
        return cls(u.hostname, u.port or 80, u.path.rstrip("/"))


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class Conn:
    """One keep-alive connection; not shared between concurrent requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False
        self.idle_since = 0.0  # loop time the last response ended

    @classmethod
    async def open(cls, ep: Endpoint) -> Conn:
        try:
            reader, writer = await asyncio.open_connection(ep.host, ep.port, limit=1 << 22)
        except OSError as exc:
            raise HttpError(f"connect failed: {exc}") from exc
        return cls(reader, writer)

    async def request(self, head: bytes, body: bytes) -> Response:
        """Send a pre-built request head (ending in CRLF CRLF) and body; read one response."""
        try:
            self.writer.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                self.writer.write(body)
            status, headers = parse_head(await self.reader.readuntil(b"\r\n\r\n"))
            if "content-length" in headers:
                data = await self.reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                data = await self._chunked()
            else:
                data = await self.reader.read()
                self.closed = True
            if headers.get("connection", "").lower() == "close":
                self.close()
            return Response(status, headers, data)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}".strip()) from exc
        except BaseException:
            self.close()  # cancelled mid-response: the stream position is unknown
            raise

    async def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return bytes(out)
            out += await self.reader.readexactly(size + 2)
            del out[-2:]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


class Pool:
    """Up to `size` connections to one endpoint; a request waits when all are busy.

    A connection idle for longer than `max_idle_s` is closed rather than reused: servers drop idle
    keep-alive connections (uvicorn after 5 s) and a request written into one would fail without
    an answer. Requests are never retried (a retry could be a duplicate).
    """

    def __init__(self, ep: Endpoint, size: int, max_idle_s: float = 2.0) -> None:
        self.ep = ep
        self.max_idle_s = max_idle_s
        self.idle: list[Conn] = []
        self.opened = 0
        self.free = size  # connections that may still be used (idle or not yet opened)
        # FIFO of requests waiting for a connection. Not asyncio.Semaphore: in 3.11 its release scans
        # every waiter, which is quadratic under the backlog an overloaded server builds.
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def head(self, path: str, extra: dict[str, str], length: int, method: str = "POST") -> bytes:
        """Request head for `method path` (relative to the endpoint's base path)."""
        ep = self.ep
        return request_head(ep.host, ep.port, f"{ep.base_path}{path}", extra.items(), length, method)

    async def request(self, head: bytes, body: bytes) -> Response:
        loop = asyncio.get_running_loop()
        if self.free > 0:
            self.free -= 1
        else:
            fut: asyncio.Future[None] = loop.create_future()
            self.waiters.append(fut)
            try:
                await fut  # the releaser handed its connection slot to us
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._release()  # handed over and cancelled in the same turn: pass it on
                elif fut in self.waiters:  # else a release already skipped it (cancelled first)
                    self.waiters.remove(fut)
                raise
        try:
            now = loop.time()
            conn = self.idle.pop() if self.idle else None
            while conn is not None and now - conn.idle_since > self.max_idle_s:
                conn.close()
                conn = self.idle.pop() if self.idle else None
            if conn is None:
                conn = await Conn.open(self.ep)
                self.opened += 1
            resp = await conn.request(head, body)
            if not conn.closed:
                conn.idle_since = loop.time()
                self.idle.append(conn)
            return resp
        finally:
            self._release()

    def _release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
