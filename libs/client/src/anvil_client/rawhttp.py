"""A small keep-alive HTTP/1.1 client over asyncio streams, for load generation.

httpx spends ~1 ms of CPU per request; on a 2-core machine that makes the load generator, not the
server, the bottleneck. This client pre-encodes nothing clever: it writes a request on one of N
persistent connections and reads the status line, headers and a Content-Length body. Enough for
Anvil's own endpoints; not a general HTTP client (no chunked bodies, no redirects).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

__all__ = ["RawHttpPool", "RawResponse"]


class RawResponse:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer


class RawHttpPool:
    """Up to `size` persistent connections to one origin; `request` borrows one per call."""

    def __init__(self, url: str, size: int = 64, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.size = size
        self.timeout_s = timeout_s
        self._idle: asyncio.LifoQueue[_Conn] = asyncio.LifoQueue()
        self._open = 0
        self._slots = asyncio.Semaphore(size)

    async def _get(self) -> _Conn:
        try:
            return self._idle.get_nowait()
        except asyncio.QueueEmpty:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self._open += 1
            return _Conn(reader, writer)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> RawResponse:
        async with self._slots:
            conn = await self._get()
            try:
                resp = await asyncio.wait_for(
                    self._roundtrip(conn, method, path, body, headers or {}), self.timeout_s
                )
            except BaseException:
                conn.writer.close()
                self._open -= 1
                raise
            if resp.headers.get("connection", "").lower() == "close":
                conn.writer.close()
                self._open -= 1
            else:
                self._idle.put_nowait(conn)
            return resp

    async def _roundtrip(
        self, conn: _Conn, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> RawResponse:
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        conn.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await conn.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        hdrs: dict[str, str] = {}
        while True:
            line = await conn.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            hdrs[key.strip().lower()] = value.strip()
        length = int(hdrs.get("content-length", "0"))
        payload = await conn.reader.readexactly(length) if length else b""
        return RawResponse(status, hdrs, payload)

    async def close(self) -> None:
        while not self._idle.empty():
            conn = self._idle.get_nowait()
            conn.writer.close()
