"""The gateway's link to the scheduler: one DEALER socket, one future per request id."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
import zmq.asyncio

from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.logs import get_logger
from anvil_core.wire import pb
from anvil_core.zmq_sockets import make_socket

__all__ = ["BackendUnavailable", "SchedulerLink"]

log = get_logger("anvil.gateway.backend")

Reply = tuple[pb.InferResponse, list[Any]]  # lazy response view, its output payload frames


class BackendUnavailable(Exception):
    """No scheduler connection can take the request right now."""


class SchedulerLink:
    """Sends InferRequests and matches InferResponses to waiting callers by request id.

    Owned by the gateway's event loop; `infer` is called by request handlers, `follow` by discovery
    when the scheduler's endpoint appears or moves.
    """

    def __init__(self, identity: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=identity, immediate=True)
        self.endpoint: str | None = None
        self.pending: dict[str, asyncio.Future[Reply]] = {}
        self._rx: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._rx = asyncio.create_task(self._rx_loop(), name="scheduler-rx")

    async def stop(self) -> None:
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(BackendUnavailable("gateway shutting down"))
        self.sock.close()
        self.ctx.term()

    def follow(self, endpoint: str) -> None:
        if self.endpoint:
            self.sock.disconnect(self.endpoint)
        self.sock.connect(endpoint)
        self.endpoint = endpoint

    async def infer(self, request_id: str, parts: list[Any], timeout_s: float) -> Reply:
        """Send [envelope, *payloads] and wait for the answer; raises TimeoutError after `timeout_s`."""
        if self.endpoint is None:
            raise BackendUnavailable("no scheduler registered")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        self.pending[request_id] = fut
        # a timer on the future itself: asyncio.wait_for would wrap every request in another task
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            try:
                await self.sock.send_multipart(parts, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                raise BackendUnavailable("scheduler not connected") from None
            return await fut
        finally:
            timer.cancel()
            self.pending.pop(request_id, None)

    async def _rx_loop(self) -> None:
        while True:
            parts = await self.sock.recv_multipart(copy=False)
            try:
                resp = codec.open_response(parts[0])
            except wire.ProtocolError as exc:
                log.warning("undecodable message from the scheduler", extra={"err": str(exc)})
                continue
            fut = self.pending.get((resp.RequestId() or b"").decode())
            if fut is not None and not fut.done():
                fut.set_result((resp, parts[1:]))


def _expire(fut: asyncio.Future[Reply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())
