"""The protocols that read the gateway's Unix connections (backend.UnixSchedulerLink): its link to
the scheduler, the executors' connections to its answer socket and its own connections to
executors' direct sockets. Each cuts the bytes into messages in the loop's read callback itself and
hands them to the link, which verifies every one; a peer that breaks the wire format is cut after
the messages that came before the broken one."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from anvil_core.unix_link import HELLO, FrameReader, LinkError, same_user
from anvil_core.unix_peers import BUSY

if TYPE_CHECKING:
    from anvil_gateway.backend import UnixSchedulerLink

__all__ = ["AnswerReader", "DirectReader", "FramedReader", "LinkReader"]


class FramedReader(asyncio.Protocol):
    """A connection's bytes cut into messages in the read callback itself, each handed to ``_take``
    (False: the connection was cut); a peer that breaks the wire format is cut after the messages
    that came before the broken one (``_cut``: counted, connection closed)."""

    def __init__(self, link: UnixSchedulerLink) -> None:
        self.link = link
        self.frames = FrameReader()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.frames.feed(data)
        except LinkError as exc:
            self._cut(str(exc))
            return
        for parts in messages:
            if not self._take(parts):
                return
        if self.frames.broken is not None:  # after the messages that came before it
            self._cut(str(self.frames.broken))

    def _take(self, parts: list[bytes]) -> bool:
        self.link.on_message(parts)  # never raises: it verifies, counts and drops
        return True

    def _cut(self, why: str) -> None:
        raise NotImplementedError

    def _close(self, reason: str, detail: str) -> None:
        self.link.drops.drop(reason, detail)
        if self.transport is not None:
            self.transport.close()


class LinkReader(FramedReader):
    """The receiving half of one connection of a ``UnixSchedulerLink``. ``lost`` completes when the
    connection ends."""

    def __init__(self, link: UnixSchedulerLink) -> None:
        super().__init__(link)
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _cut(self, why: str) -> None:
        self._close("recv", f"unix link to the scheduler: {why}")

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.link.drops.drop("recv", f"unix link to the scheduler: {exc}")
        if not self.lost.done():
            self.lost.set_result(None)


class AnswerReader(FramedReader):
    """One executor's connection to a gateway's answer socket: a peer of another user is cut at
    once; the first message must be a hello naming the executor; every later one (an answer, or a
    bundle of them) goes to ``on_message``, which verifies it. A broken format cuts the connection
    (the executor sends what it could not deliver through the scheduler)."""

    def __init__(self, link: UnixSchedulerLink) -> None:
        super().__init__(link)
        self.peer: bytes | None = None  # the executor's identity, from its hello

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is None or not same_user(sock):
            self._close("unexpected", "answer socket: refused a connection from another user")
            return
        self.link.answer_connects += 1

    def _take(self, parts: list[bytes]) -> bool:
        if self.peer is not None:
            self.link.on_message(parts, via=self.peer.decode(errors="replace"))
            return True
        if len(parts) != 2 or parts[0] != HELLO or not 0 < len(parts[1]) <= 255:
            self._cut("its first message is not a hello with an identity")
            return False
        self.peer = parts[1]
        return True

    def _cut(self, why: str) -> None:
        self._close("invalid", f"answer socket: connection of {self.peer!r} closed: {why}")


class DirectReader(FramedReader):
    """This gateway's connection to one executor's direct socket: the executor must run as this
    user (else cut at once); what it sends is an answer (verified and matched as any), or ``[BUSY,
    request id]`` for a request of this connection it hands back."""

    def __init__(self, link: UnixSchedulerLink, executor: str) -> None:
        super().__init__(link)
        self.executor = executor

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is None or not same_user(sock):
            self._close("unexpected", f"direct socket of {self.executor!r} is served by another user")

    def _take(self, parts: list[bytes]) -> bool:
        if len(parts) == 2 and parts[0] == BUSY:
            self.link.on_busy(self, parts)
        else:
            self.link.on_message(parts, via=self.executor)
        return True

    def _cut(self, why: str) -> None:
        self._close("invalid", f"direct connection of {self.executor!r} closed: {why}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.link.direct_lost(self)
