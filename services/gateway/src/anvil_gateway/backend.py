"""The gateway's link to the scheduler: one DEALER socket, one future per request id."""

from __future__ import annotations

import asyncio
from typing import Any, cast

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

    def __init__(self, identity: str, bundle_max: int = 8) -> None:
        if bundle_max < 1:
            raise ValueError(f"bundle_max must be >= 1, got {bundle_max}")
        self.bundle_max = bundle_max
        self.ctx = zmq.asyncio.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=identity, immediate=True)
        self.endpoint: str | None = None
        self.pending: dict[str, asyncio.Future[Reply]] = {}
        self._outbox: list[tuple[str, list[Any]]] = []  # requests of this loop turn, not yet sent
        self._rx: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._rx = asyncio.create_task(self._rx_loop(), name="scheduler-rx")

    async def stop(self) -> None:
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        self._outbox = []  # their callers are failed just below
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

    async def infer(self, request_id: str, parts: list[Any], timeout_s: float, urgent: bool = False) -> Reply:
        """Send [envelope, *payloads] and wait for the answer; raises TimeoutError after `timeout_s`.

        Requests made in one event-loop turn leave together, as bundles of up to `bundle_max` (see
        infer_codec): a full bundle at once, the rest at the end of the turn. An `urgent` request
        (priority 1) does not wait for the turn's end: it leaves at once with what is pending.
        """
        if self.endpoint is None:
            raise BackendUnavailable("no scheduler registered")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        self.pending[request_id] = fut
        # a timer on the future itself: asyncio.wait_for would wrap every request in another task
        timer = loop.call_later(timeout_s, _expire, fut)
        self._outbox.append((request_id, parts))
        if urgent or len(self._outbox) >= self.bundle_max:
            self._flush()  # now: the scheduler can start on a full bundle, or an interactive request
        elif len(self._outbox) == 1:
            loop.call_soon(self._flush)
        try:
            return await fut
        finally:
            timer.cancel()
            self.pending.pop(request_id, None)

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if not out:
            return
        request_ids = [rid for rid, _ in out]
        msg = codec.bundle([parts for _, parts in out], responses=False)
        try:
            # zmq.asyncio returns a Future (typed as an Awaitable); a refused send is its exception
            sent = cast(asyncio.Future[Any], self.sock.send_multipart(msg, copy=False, flags=zmq.NOBLOCK))
        except zmq.ZMQError as exc:  # e.g. the socket closed by stop() before this turn ended
            self._fail(request_ids, exc)
            return
        sent.add_done_callback(lambda f: self._sent(f, request_ids))

    def _sent(self, sent: asyncio.Future[Any], request_ids: list[str]) -> None:
        if sent.cancelled() or sent.exception() is None:
            return
        self._fail(request_ids, sent.exception())

    def _fail(self, request_ids: list[str], exc: BaseException | None) -> None:
        why = "scheduler not connected" if isinstance(exc, zmq.Again) else f"send failed: {exc}"
        for rid in request_ids:
            fut = self.pending.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(BackendUnavailable(why))

    async def _rx_loop(self) -> None:
        while True:
            parts = await self.sock.recv_multipart(copy=False)
            try:
                groups = codec.unbundle(parts)
            except wire.ProtocolError as exc:
                log.warning("undecodable message from the scheduler", extra={"err": str(exc)})
                continue
            for group in groups:
                try:
                    resp = codec.open_response(group[0])
                except wire.ProtocolError as exc:
                    log.warning("undecodable response from the scheduler", extra={"err": str(exc)})
                    continue
                fut = self.pending.get((resp.RequestId() or b"").decode())
                if fut is not None and not fut.done():
                    fut.set_result((resp, group[1:]))


def _expire(fut: asyncio.Future[Reply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())
