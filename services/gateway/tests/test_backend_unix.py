"""UnixSchedulerLink (ANVIL_LINK_TRANSPORT=unix) against a real UnixRouter, as the scheduler serves
it: requests travel as bundles and answers find their callers, a request with no link fails at once,
and the link comes back by itself after the scheduler's socket does."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from anvil_core import codec
from anvil_core.unix_link import HELLO, FrameReader, UnixRouter, encode, unix_endpoint, unix_path
from anvil_core.unix_peers import AnswerSender
from anvil_gateway.backend import BackendUnavailable, UnixSchedulerLink

sys.path.insert(0, str(Path(__file__).parent))
from test_backend import _request, _response


class Scheduler(threading.Thread):
    """A stand-in scheduler on the gateway link's Unix socket: answers every request it receives."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.router = UnixRouter(unix_path(endpoint))
        self.stop = threading.Event()
        self.seen: list[list[str]] = []  # request ids per received bundle
        self.peers: set[bytes] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            poller = zmq.Poller()
            for fd, wants_write in self.router.fds():
                poller.register(fd, zmq.POLLIN | (zmq.POLLOUT if wants_write else 0))
            for fd, flags in poller.poll(20):
                msgs, _ = self.router.on_ready(fd, bool(flags & zmq.POLLOUT))
                for ident, parts in msgs:
                    self.peers.add(ident)
                    rids = [body.requestId for body, _ in codec.unbundle(parts)]
                    self.seen.append(rids)
                    reply = codec.bundle([_response(r.encode()) for r in rids], responses=True)
                    self.router.send(ident, reply)
        self.router.close()

    def halt(self) -> None:
        self.stop.set()
        self.join(5)


async def _connected(link: UnixSchedulerLink, connects: int, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while link.connects < connects or not link.connected:
        assert time.monotonic() < deadline, "the link did not connect"
        await asyncio.sleep(0.01)


def test_requests_and_answers_cross_the_unix_link_and_it_reconnects(tmp_path: Path) -> None:
    endpoint = unix_endpoint(str(tmp_path), "gateway")

    async def main() -> None:
        sched = Scheduler(endpoint)
        sched.start()
        link = UnixSchedulerLink("gw-test", bundle_max=2, retry_s=0.01)
        link.follow(endpoint)
        link.start()
        try:
            await _connected(link, 1)
            rids = [f"r{i}" for i in range(5)]
            got = await asyncio.gather(*(link.infer(r, _request(r), 5) for r in rids))
            assert [resp.requestId for resp, _ in got] == rids
            assert [[bytes(f) for f in frames] for _, frames in got] == [[b"out-" + r.encode()] for r in rids]
            assert [len(b) for b in sched.seen] == [2, 2, 1]  # bundles of bundle_max, as over ZeroMQ
            assert sched.peers == {b"gw-test"}  # named by its hello
            sched.halt()  # the scheduler goes away
            while link.connected:
                await asyncio.sleep(0.01)
            with pytest.raises(BackendUnavailable, match="not connected"):
                await link.infer("lost", _request("lost"), 1)
            sched = Scheduler(endpoint)  # and comes back
            sched.start()
            await _connected(link, 2)
            resp, _ = await link.infer("again", _request("again"), 5)
            assert resp.requestId == "again"
            assert link.alive and not link.pending
        finally:
            await link.stop()
            sched.halt()

    asyncio.run(main())


def test_no_endpoint_yet_is_refused_at_once() -> None:
    async def main() -> None:
        link = UnixSchedulerLink("gw-test")
        link.start()
        try:
            with pytest.raises(BackendUnavailable, match="no scheduler"):
                await link.infer("r", _request("r"), 1)
        finally:
            await link.stop()

    asyncio.run(main())


def test_a_peer_that_breaks_the_wire_format_is_dropped_after_its_good_answers(tmp_path: Path) -> None:
    """Answers that arrive before a malformed message still reach their callers (they are handed on
    in the read callback, message by message); the malformed one is counted, the connection closed,
    and the link connects again by itself."""
    path = str(tmp_path / "sched.usock")
    hellos: list[bytes] = []

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames = FrameReader()
            while data := await reader.read(1 << 16):
                for parts in frames.feed(data):
                    if parts[0] == HELLO:
                        hellos.append(parts[1])
                        continue
                    rid = codec.unbundle(parts)[0][0].requestId
                    # the answer, then a message header of 0 frames, in one write
                    writer.writelines([*encode(_response(rid.encode())), bytes(4)])
            writer.close()

        server = await asyncio.start_unix_server(serve, path)
        link = UnixSchedulerLink("gw-test", retry_s=0.01)
        link.follow(unix_endpoint(str(tmp_path), "sched"))
        link.start()
        try:
            await _connected(link, 1)
            resp, frames = await link.infer("a", _request("a"), 5)
            assert resp.requestId == "a" and [bytes(f) for f in frames] == [b"out-a"]
            await _connected(link, 2)  # cut off for the bad header, then back
            assert link.drops.counts.get("recv", 0) >= 1
            assert hellos[:2] == [b"gw-test", b"gw-test"]
        finally:
            await link.stop()
            server.close()

    asyncio.run(main())


def test_answers_written_to_the_answer_socket_reach_their_callers(tmp_path: Path) -> None:
    """Direct answers: the link serves answers-<identity>.usock (0600) beside the scheduler's socket;
    an executor's answer written there resolves the caller (the scheduler stand-in answers nothing);
    a peer whose first message is not a hello is cut; the socket goes away with the link."""
    path = str(tmp_path / "gateway.usock")
    seen: list[str] = []

    async def main() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frames = FrameReader()
            while data := await reader.read(1 << 16):
                for parts in frames.feed(data):
                    if parts[0] != HELLO:
                        seen.extend(body.requestId for body, _ in codec.unbundle(parts))
            writer.close()

        server = await asyncio.start_unix_server(silent, path)
        link = UnixSchedulerLink("gw-test", retry_s=0.01)
        link.follow(unix_endpoint(str(tmp_path), "gateway"))
        link.start()
        sender = AnswerSender(str(tmp_path), "ex-1", timeout_s=1)
        try:
            await _connected(link, 1)
            sock_path = tmp_path / "answers-gw-test.usock"
            assert link.answer_path == str(sock_path)
            assert sock_path.stat().st_mode & 0o777 == 0o600
            call = asyncio.ensure_future(link.infer("a", _request("a"), 5))
            while "a" not in seen:
                await asyncio.sleep(0.005)
            assert await asyncio.to_thread(sender.send, "gw-test", _response(b"a"))
            resp, frames = await call
            assert resp.requestId == "a" and [bytes(f) for f in frames] == [b"out-a"]
            assert link.answer_connects == 1
            rogue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # no hello: cut
            rogue.connect(str(sock_path))
            rogue.sendall(b"".join(encode(_response(b"x"))))
            while link.drops.counts.get("invalid", 0) < 1:
                await asyncio.sleep(0.005)
            rogue.close()
        finally:
            sender.close()
            await link.stop()
            server.close()
        assert not (tmp_path / "answers-gw-test.usock").exists()

    asyncio.run(main())
