"""Direct requests at the gateway (backend.UnixSchedulerLink, docs/scheduler.md "Direct requests"):
once an executor has answered a model itself, a lone request of that model goes to that executor's
direct socket; a request with others in flight, of more rows than ``direct_max_rows``, or of a
model handed back as busy a moment ago, goes through the scheduler; a busy answer and a connection
that ends before the answer send the request through the scheduler, once. Stand-ins: an asyncio
scheduler on the link's socket whose answers an "executor" writes to the gateway's answer socket
(AnswerSender), and an asyncio direct socket playing the executor."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from anvil_core import codec
from anvil_core.unix_link import HELLO, FrameReader, encode, unix_endpoint
from anvil_core.unix_peers import BUSY, AnswerSender, direct_path
from anvil_gateway.backend import UnixSchedulerLink

sys.path.insert(0, str(Path(__file__).parent))
from test_backend import _request, _response
from test_backend_unix import _connected


class Stand:
    """The scheduler stand-in (answers through the executor's AnswerSender, as direct answers go)
    and the executor's direct socket (answers, hands back, or hangs up, by ``mode``)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.scheduled: list[str] = []  # request ids the scheduler got
        self.direct: list[str] = []  # request ids the executor's direct socket got
        self.hellos: list[bytes] = []
        self.mode = "answer"  # answer | busy | hangup
        self.sender = AnswerSender(str(tmp), "ex-1", timeout_s=1)

    async def serve(self) -> None:
        """Both sockets listening: the scheduler's gateway link and ex-1's direct socket."""
        path = direct_path(str(self.tmp), "ex-1")
        assert path is not None
        self.servers = [
            await asyncio.start_unix_server(self.scheduler, str(self.tmp / "gateway.usock")),
            await asyncio.start_unix_server(self.executor, path),
        ]

    async def link(self, identity: str, **options: Any) -> UnixSchedulerLink:
        """A gateway's link to the stand-in scheduler, connected."""
        link = UnixSchedulerLink(identity, retry_s=0.01, **options)
        link.follow(unix_endpoint(str(self.tmp), "gateway"))
        link.start()
        await _connected(link, 1)
        return link

    def close(self) -> None:
        self.sender.close()
        for server in self.servers:
            server.close()

    async def scheduler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        gateway = ""
        while data := await reader.read(1 << 16):
            for parts in frames.feed(data):
                if parts[0] == HELLO:
                    gateway = parts[1].decode()
                    continue
                for body, _ in codec.unbundle(parts):
                    self.scheduled.append(body.requestId)
                    answer = _response(body.requestId.encode())
                    assert await asyncio.to_thread(self.sender.send, gateway, answer)
        writer.close()

    async def executor(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        while data := await reader.read(1 << 16):
            for parts in frames.feed(data):
                if parts[0] == HELLO:
                    self.hellos.append(parts[1])
                    continue
                model, rid, *request = parts
                assert model == b"m" and codec.unbundle(request)[0][0].requestId == rid.decode()
                self.direct.append(rid.decode())
                if self.mode == "hangup":
                    writer.close()
                    return
                writer.writelines(encode([BUSY, rid] if self.mode == "busy" else _response(rid)))
        writer.close()


async def _call(link: UnixSchedulerLink, rid: str) -> Any:
    resp, frames = await link.infer(rid, _request(rid), 5, model="m", rows=1)
    assert resp.requestId == rid and [bytes(f) for f in frames] == [b"out-" + rid.encode()]
    return resp


def test_lone_requests_go_to_the_executor_and_come_back_through_the_scheduler_when_handed_back(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        stand = Stand(tmp_path)
        await stand.serve()
        link = await stand.link("gw-test", busy_backoff_s=0.2)
        try:
            await _call(link, "r1")  # nothing learnt yet: the scheduler; ex-1 answered it itself
            await _call(link, "r2")  # ex-1 learnt, not connected yet: the scheduler, and it connects
            assert stand.scheduled == ["r1", "r2"] and not stand.direct
            while "ex-1" not in link._executors:
                await asyncio.sleep(0.005)
            await _call(link, "r3")  # lone: straight to ex-1
            assert stand.direct == ["r3"] and stand.hellos == [b"gw-test"]
            resp, _ = await link.infer("big", _request("big"), 5, model="m", rows=2)  # over direct_max_rows
            assert resp.requestId == "big" and stand.scheduled[-1] == "big" and stand.direct == ["r3"]
            # r4 is alone when it leaves (direct); r5 finds r4 in flight: the scheduler
            await asyncio.gather(_call(link, "r4"), _call(link, "r5"))
            assert stand.scheduled[-1] == "r5" and stand.direct == ["r3", "r4"]

            stand.mode = "busy"
            await _call(link, "r6")  # handed back: then through the scheduler, once
            assert stand.direct[-1] == "r6" and stand.scheduled[-1] == "r6"
            await _call(link, "r7")  # m was busy a moment ago: the scheduler
            assert stand.direct[-1] == "r6" and stand.scheduled[-1] == "r7"

            stand.mode = "hangup"
            link._busy_until.clear()  # the backoff over
            await _call(link, "r8")  # its connection ends before the answer: the scheduler
            assert stand.direct[-1] == "r8" and stand.scheduled[-1] == "r8"
            assert "ex-1" not in link._executors
            assert stand.scheduled.count("r6") == stand.scheduled.count("r8") == 1
            assert not link.pending and not link._sent_direct
        finally:
            await link.stop()
            stand.close()

    asyncio.run(main())


def test_a_request_naming_no_model_or_with_direct_off_goes_through_the_scheduler(tmp_path: Path) -> None:
    async def main() -> None:
        stand = Stand(tmp_path)
        await stand.serve()
        links = [await stand.link("gw-test", direct=False)]
        try:
            for rid in ("a", "b", "c"):
                await _call(links[0], rid)
            assert not links[0]._executors
            links.append(await stand.link("gw-two"))  # on, but its requests name a version
            link = links[1]
            for rid in ("d", "e", "f"):
                resp, _ = await link.infer(rid, _request(rid), 5)  # model="": a version was named
                assert resp.requestId == rid
            assert not stand.direct and stand.scheduled == list("abcdef")
        finally:
            for one in links:
                await one.stop()
            stand.close()

    asyncio.run(main())
