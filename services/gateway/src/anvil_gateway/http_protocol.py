"""uvicorn's httptools protocol with the writes of one event-loop turn sent as one.

uvicorn writes a response's status line and headers when the app sends `http.response.start`,
and the body on `http.response.body`: two `write()` syscalls per response, and on loopback two
deliveries that each wake the client. Starlette sends both messages in one turn of the loop, so
holding writes until the end of the turn and handing them to the transport together (`writelines`:
one vectored write under uvloop) halves the syscalls without delaying a byte past the turn it was
written in. Closing flushes first, so a response is never cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol", "TurnWriter"]


class TurnWriter:
    """A transport proxy: `write()`s are buffered and leave together at the end of the loop turn.

    Everything but writing, closing and the write-buffer size passes through to the transport.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, chunks: Any) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` over a `TurnWriter` (pass the class as uvicorn's `http`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        writer = TurnWriter(transport, asyncio.get_running_loop())
        super().connection_made(writer)  # type: ignore[arg-type]
