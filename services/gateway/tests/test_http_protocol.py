"""The gateway's uvicorn protocol: a response's writes of one loop turn leave in one call."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from anvil_gateway.http_protocol import CoalescingHttpToolsProtocol, TurnWriter


class FakeTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes]]] = []
        self.closing = False

    def writelines(self, chunks: list[bytes]) -> None:
        self.calls.append(("writelines", [bytes(c) for c in chunks]))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", []))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", []))
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 10

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def test_writes_of_one_turn_leave_together_in_order() -> None:
    async def main() -> list[tuple[str, list[bytes]]]:
        t = FakeTransport()
        w = TurnWriter(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        w.write(b"HTTP/1.1 200 OK\r\n\r\n")
        w.write(b"")  # nothing to send: not a chunk of its own
        w.write(b"body")
        assert t.calls == [] and w.get_write_buffer_size() == 10 + 19 + 4  # held until the turn ends
        await asyncio.sleep(0)
        w.writelines([b"next", b"turn"])
        await asyncio.sleep(0)
        assert w.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest passes through
        return t.calls

    assert asyncio.run(main()) == [
        ("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"body"]),
        ("writelines", [b"next", b"turn"]),
    ]


def test_close_flushes_first_and_abort_drops() -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        t1, t2 = FakeTransport(), FakeTransport()
        loop = asyncio.get_running_loop()
        w1, w2 = TurnWriter(t1, loop), TurnWriter(t2, loop)  # type: ignore[arg-type]
        w1.write(b"last words")
        w1.close()
        w2.write(b"never sent")
        w2.abort()
        await asyncio.sleep(0)  # the flushes scheduled by the writes find nothing left
        return t1.calls, t2.calls

    closed, aborted = asyncio.run(main())
    assert closed == [("writelines", [b"last words"]), ("close", [])]
    assert aborted == [("abort", [])]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    size = int(scope["path"].rsplit("/", 1)[-1])
    out = (body or b"x") * (size // max(1, len(body or b"x")))
    headers = [(b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def _request(path: str, body: bytes, close: bool = False) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n"
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_pipelined_keep_alive_responses_arrive_whole(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real uvicorn server: three pipelined requests, one answer of 1 MiB, then close;
    each response's status line, headers and body leave in one flush (uvicorn writes them twice)."""
    flushes: list[int] = []
    flush = TurnWriter.flush

    def counted(self: TurnWriter) -> None:
        if self._pending:
            flushes.append(len(self._pending))
        flush(self)

    monkeypatch.setattr(TurnWriter, "flush", counted)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=CoalescingHttpToolsProtocol, log_config=None, access_log=False)
    server = uvicorn.Server(config)

    async def client() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        big = _request("/1048576", b"0123456789abcdef")
        writer.write(_request("/4", b"ab") + big + _request("/3", b"z", close=True))
        data = await asyncio.wait_for(reader.read(-1), 20)  # to EOF: the server closes after the third
        writer.close()
        return data

    async def main() -> bytes:
        serve = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return await client()
        finally:
            server.should_exit = True
            await serve

    if loop == "uvloop":
        import uvloop

        raw = uvloop.run(main())
    else:
        raw = asyncio.run(main())
    parts = raw.split(b"HTTP/1.1 200 OK\r\n")
    assert len(parts) == 4 and parts[0] == b""
    bodies = [p.split(b"\r\n\r\n", 1)[1] for p in parts[1:]]
    assert bodies[0] == b"abab" and bodies[2] == b"zzz"
    assert bodies[1] == b"0123456789abcdef" * (1 << 16)
    assert sum(flushes) == 6 and len(flushes) <= 3, flushes  # 3 x (head, body), never a head alone
