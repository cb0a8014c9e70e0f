"""The gateway's link to the scheduler: one DEALER socket, one future per request id.

The receive loop survives any message (issue #18): every response is verified by the wire codec
before a field is used; a refused one is counted in ``anvil_dropped_messages_total{service="gateway"}``
and logged (rate-limited), and when its request id still reads, that caller gets the error at once
instead of a timeout. Should the loop still end (a bug), ``alive`` turns False, the failure is
logged, and readiness reports it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, cast

import zmq
import zmq.asyncio

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.curve import CurveClient
from anvil_core.drops import DropLog
from anvil_core.logs import get_logger
from anvil_core.unix_link import HELLO, MAX_QUEUED_BYTES, encode, unix_path
from anvil_core.unix_peers import answer_path, direct_path
from anvil_core.zmq_auth import PeerLog, watch_handshakes
from anvil_core.zmq_sockets import make_socket
from anvil_gateway import metrics as m
from anvil_gateway.link_readers import AnswerReader, DirectReader, LinkReader

__all__ = ["BackendUnavailable", "SchedulerLink", "UnixSchedulerLink"]

log = get_logger("anvil.gateway.backend")

Reply = tuple[pb.InferResponseT, list[Any]]  # verified response, its output payload frames


class BackendUnavailable(Exception):
    """No scheduler connection can take the request right now."""


class SchedulerLink:
    """Sends InferRequests and matches InferResponses to waiting callers by request id.

    Owned by the gateway's event loop; `infer` is called by request handlers, `follow` by discovery
    when the scheduler's endpoint appears or moves.
    """

    def __init__(self, identity: str, bundle_max: int = 8, curve: CurveClient | None = None) -> None:
        if bundle_max < 1:
            raise ValueError(f"bundle_max must be >= 1, got {bundle_max}")
        self.bundle_max = bundle_max
        self.identity = identity
        self.handshakes = PeerLog(log, "gateway")  # a wrong scheduler key: logged once, not per retry
        self._open(identity, curve)
        self.endpoint: str | None = None
        self.pending: dict[str, asyncio.Future[Reply]] = {}
        self._outbox: list[tuple[str, list[Any]]] = []  # requests of this loop turn, not yet sent
        self._rx: asyncio.Task[None] | None = None
        self.drops = DropLog(log, "gateway")
        self.died: str | None = None  # why the receive loop ended, if it did while running
        self.late_answers = 0
        # sees every verified answer, late ones too (the statistics count batches: stats.py)
        self.on_executed: Callable[[pb.InferResponseT], None] | None = None

    def _open(self, identity: str, curve: CurveClient | None) -> None:
        self.ctx = zmq.asyncio.Context()
        # curve: the gateway's keypair and the scheduler's key (issue #18); None: plain ZMTP
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=identity, immediate=True, curve=curve)
        if curve is not None:
            watch_handshakes(self.sock, self.handshakes, "scheduler")

    def start(self) -> None:
        self._rx = asyncio.create_task(self._rx_loop(), name="scheduler-rx")
        self._rx.add_done_callback(self._rx_ended)

    @property
    def unconnected(self) -> str | None:
        """Why requests cannot leave now, or None (ZeroMQ connects by itself: always None here)."""
        return None

    @property
    def alive(self) -> bool:
        """The receive loop runs: answers from the scheduler can reach their callers."""
        return self._rx is not None and not self._rx.done()

    def _rx_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stop()
        exc = task.exception()
        self.died = f"scheduler receive loop ended: {type(exc).__name__ if exc else 'returned'}: {exc}"
        log.error("scheduler receive loop died", extra={"err": self.died}, exc_info=exc)
        for fut in self.pending.values():  # nobody will answer them now
            if not fut.done():
                fut.set_exception(BackendUnavailable(self.died))

    async def stop(self) -> None:
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        self._outbox = []  # their callers are failed just below
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(BackendUnavailable("gateway shutting down"))
        self._close()

    def _close(self) -> None:
        self.sock.close()
        self.ctx.term()

    def follow(self, endpoint: str) -> None:
        if self.endpoint:
            self.sock.disconnect(self.endpoint)
        self.sock.connect(endpoint)
        self.endpoint = endpoint

    async def infer(
        self,
        request_id: str,
        parts: list[Any],
        timeout_s: float,
        urgent: bool = False,
        model: str = "",
        rows: int = 1,
    ) -> Reply:
        """Send [envelope, *payloads] and wait for the answer; raises TimeoutError after `timeout_s`.

        Requests made in one event-loop turn leave together, as bundles of up to `bundle_max` (see
        anvil_core.codec.messages): a full bundle at once, the rest at the end of the turn. An
        `urgent` request (priority 1) does not wait for the turn's end: it leaves at once with what
        is pending. `model`: the request's model when it names no version, which lets a lone
        request of at most ``direct_max_rows`` `rows` go to an executor directly
        (``UnixSchedulerLink``); "" never does.
        """
        if self.endpoint is None:
            raise BackendUnavailable("no scheduler registered")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        self.pending[request_id] = fut
        # a timer on the future itself: asyncio.wait_for would wrap every request in another task
        timer = loop.call_later(timeout_s, _expire, fut)
        if not (model and self._direct(request_id, model, parts, rows)):
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
            self._settled(request_id)

    def _direct(self, request_id: str, model: str, parts: list[Any], rows: int) -> bool:
        """Whether the request went to an executor directly (``UnixSchedulerLink``); never here."""
        return False

    def _settled(self, request_id: str) -> None:
        """The request's caller has its answer, or gave up."""

    def _answered_by(self, model: str, executor: str) -> None:
        """A good answer for `model` came from `executor` itself (its answer or direct connection)."""

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if not out:
            return
        request_ids = [rid for rid, _ in out]
        msg = codec.bundle([parts for _, parts in out], responses=False)
        self._send(msg, request_ids)

    def _send(self, msg: list[Any], request_ids: list[str]) -> None:
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
            try:
                parts = await self.sock.recv_multipart(copy=False)
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    raise  # the socket is gone: the loop ends, and says so (_rx_ended)
                self.drops.drop("recv", str(exc))
                continue
            self.on_message(parts)

    def on_message(self, parts: list[Any], via: str = "") -> None:
        """One message from the scheduler (or from the executor `via`, on Unix links): a response,
        or a bundle of them. Never raises."""
        try:
            groups = codec.unbundle(parts)
        except codec.ProtocolError as exc:
            self.drops.drop(exc.reason, str(exc))
            return
        except Exception as exc:  # a bug: counted and logged with its traceback, the loop goes on
            self.drops.drop("internal", f"{type(exc).__name__}: {exc}", exc_info=True)
            return
        for body, group in groups:
            try:
                self._on_response(body, group, via)
            except codec.ProtocolError as exc:
                self.drops.drop(exc.reason, str(exc))
            except Exception as exc:
                self.drops.drop("internal", f"{type(exc).__name__}: {exc}", exc_info=True)

    def _on_response(self, body: Any, group: list[Any], via: str = "") -> None:
        if isinstance(body, codec.ProtocolError):
            ids = codec.peek_request_ids(group[0])  # a caller that can be told now, not at its timeout
            fut = None if ids is None else self.pending.get(ids[0])
            if fut is not None and not fut.done():
                fut.set_exception(BackendUnavailable(f"malformed answer from the scheduler: {body}"))
            raise body
        if not isinstance(body, pb.InferResponseT):
            raise codec.ProtocolError(f"the scheduler sent a {type(body).__name__}", "unexpected")
        if self.on_executed is not None:
            self.on_executed(body)
        fut = self.pending.get(body.requestId or "")
        if fut is None or fut.done():
            self.late_answers += 1  # its caller timed out (504) or left: expected, not an error
            return
        try:
            codec.check_payloads(body.outputs, group[1:], "output")
        except codec.ProtocolError as exc:  # its caller hears it; the loop goes on
            fut.set_exception(BackendUnavailable(f"malformed answer from the scheduler: {exc}"))
            raise
        fut.set_result((body, group[1:]))
        if via and body.error is None and body.model:
            self._answered_by(body.model, via)


class UnixSchedulerLink(SchedulerLink):
    """The same link over this host's Unix stream socket (``ANVIL_LINK_TRANSPORT=unix``,
    anvil_core.unix_link): the loop writes into the socket and reads from it, no ZeroMQ I/O thread in
    between. It connects (and reconnects after a loss, every ``retry_s``) on its receive task; a
    request made while there is no connection fails at once (``BackendUnavailable``), as one to a
    ZeroMQ link with no scheduler does. Requests in flight when the link drops hear nothing more
    and end at their deadline, as over ZeroMQ.

    Answers are read by an ``asyncio.Protocol`` (``LinkReader``): the loop's read callback cuts the
    bytes into messages and resolves the callers' futures in the same turn. (A StreamReader would
    wake the receive task first and resolve them a loop turn later: one turn more per answer.)

    Direct answers (``answers``, on by default): the link also listens on its answer socket,
    ``answers-<identity>.usock`` in the scheduler's link directory (0600 in that 0700 directory;
    peers of another user are cut before a byte is read; a hello first), where this host's
    executors write the answers to this gateway's requests themselves when the scheduler asks them
    to (``Batch.reply_to``): one hop and one process fewer on the way back. What arrives there is
    verified and matched exactly as the scheduler's messages are.

    Direct requests (``direct``, on by default; docs/scheduler.md): a request of at most
    ``direct_max_rows`` rows that finds nothing else of this gateway in flight goes to the executor
    that last answered its model itself, on
    that executor's direct socket (``direct-<executor>.usock`` in the link directory; connected in
    the background on first need, this user's only, a hello first). The executor runs it when idle
    and answers on that connection, or hands it back (``BUSY``): it then goes through the
    scheduler, and that model's requests do for ``busy_backoff_s``. A request whose connection ends
    before its answer goes through the scheduler too: each request is answered once (its future),
    at worst run twice, as a re-dispatched batch is."""

    def __init__(
        self,
        identity: str,
        bundle_max: int = 8,
        retry_s: float = 0.1,
        answers: bool = True,
        direct: bool = True,
        busy_backoff_s: float = 0.05,
        direct_max_rows: int = 1,
    ) -> None:
        self.retry_s = retry_s
        self.answers = answers
        self._answer_server: asyncio.AbstractServer | None = None
        self.answer_path: str | None = None  # the answer socket being served
        self.answer_connects = 0
        self.direct = direct and answers  # executors are learnt from their direct answers
        self.busy_backoff_s = busy_backoff_s
        self.direct_max_rows = direct_max_rows
        self._served_by: dict[str, str] = {}  # model -> the executor that last answered it itself
        self._executors: dict[str, DirectReader] = {}  # executor -> its open direct connection
        self._opening: dict[str, asyncio.Task[None]] = {}  # executor -> its connection being made
        self._retry_at: dict[str, float] = {}  # executor -> when to try connecting again (monotonic)
        self._busy_until: dict[str, float] = {}  # model -> direct again from then on (monotonic)
        # request id -> (its connection, model, parts) while a direct request waits for its answer
        self._sent_direct: dict[str, tuple[DirectReader, str, list[Any]]] = {}
        super().__init__(identity, bundle_max, None)

    def _open(self, identity: str, curve: CurveClient | None) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._path: str | None = None
        self._followed = asyncio.Event()  # set by follow: connect now, not at the next retry
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._transport is not None

    @property
    def unconnected(self) -> str | None:
        return None if self._transport is not None else "no Unix link to the scheduler yet"

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._stop_answers()
        for task in self._opening.values():
            task.cancel()
        for reader in list(self._executors.values()):
            if reader.transport is not None:
                reader.transport.close()
        self._executors.clear()

    # ---- direct requests ----------------------------------------------------------------------
    def _direct(self, request_id: str, model: str, parts: list[Any], rows: int) -> bool:
        """Send a lone request (nothing else of this gateway in flight) of at most
        ``direct_max_rows`` rows to the executor that last answered `model` itself; False: it goes
        through the scheduler (and a connection to that executor is made meanwhile when there is
        none)."""
        if not self.direct or rows > self.direct_max_rows or len(self.pending) > 1 or self._outbox:
            return False
        executor = self._served_by.get(model)
        if executor is None or time.monotonic() < self._busy_until.get(model, 0.0):
            return False
        reader = self._executors.get(executor)
        transport = None if reader is None else reader.transport
        if reader is None or transport is None or transport.is_closing():
            self._open_direct(executor)
            return False
        transport.writelines(encode([model.encode(), request_id.encode(), *parts]))  # type: ignore[attr-defined]
        self._sent_direct[request_id] = (reader, model, parts)
        m.direct_requests.labels(outcome="sent").inc()
        return True

    def _settled(self, request_id: str) -> None:
        self._sent_direct.pop(request_id, None)

    def _answered_by(self, model: str, executor: str) -> None:
        self._served_by[model] = executor

    def _via_scheduler(self, request_id: str, outcome: str) -> None:
        """A direct request handed back (busy) or cut off (lost): through the scheduler now, once."""
        entry = self._sent_direct.pop(request_id, None)
        fut = self.pending.get(request_id)
        if entry is None or fut is None or fut.done():
            return
        m.direct_requests.labels(outcome=outcome).inc()
        self._outbox.append((request_id, entry[2]))
        self._flush()

    def on_busy(self, reader: DirectReader, parts: list[bytes]) -> None:
        """An executor handed back ``[BUSY, request id]`` on `reader`'s connection."""
        rid = parts[1].decode(errors="replace")
        entry = self._sent_direct.get(rid)
        if entry is None:  # its caller has given up meanwhile (deadline): nothing to send
            return
        if entry[0] is not reader:  # not a request sent on this connection
            self.drops.drop("unexpected", f"direct connection of {reader.executor!r}: busy for {rid[:80]!r}")
            return
        self._busy_until[entry[1]] = time.monotonic() + self.busy_backoff_s
        self._via_scheduler(rid, "busy")

    def direct_lost(self, reader: DirectReader) -> None:
        """`reader`'s connection to an executor ended: its requests go through the scheduler."""
        if self._executors.get(reader.executor) is reader:
            del self._executors[reader.executor]
        retry_at = time.monotonic() + self.retry_s
        self._retry_at[reader.executor] = max(self._retry_at.get(reader.executor, 0.0), retry_at)
        for rid in [rid for rid, entry in self._sent_direct.items() if entry[0] is reader]:
            self._via_scheduler(rid, "lost")

    def _open_direct(self, executor: str) -> None:
        if executor in self._opening or time.monotonic() < self._retry_at.get(executor, 0.0):
            return
        if self._path is None:  # no link directory (yet)
            return
        path = direct_path(os.path.dirname(self._path), executor)
        if path is None:
            self._retry_at[executor] = float("inf")  # an identity that names no socket: never
            return
        task = asyncio.get_running_loop().create_task(self._connect_direct(executor, path))
        self._opening[executor] = task
        task.add_done_callback(lambda _: self._opening.pop(executor, None))

    async def _connect_direct(self, executor: str, path: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, reader = await loop.create_unix_connection(lambda: DirectReader(self, executor), path)
        except OSError:  # no such socket (an executor without it, or gone): try again later
            self._retry_at[executor] = time.monotonic() + self.retry_s
            return
        if transport.is_closing():  # refused in connection_made (another user's socket)
            self._retry_at[executor] = float("inf")
            return
        transport.writelines(encode([HELLO, self.identity.encode()]))
        self._executors[executor] = reader

    async def _serve_answers(self, ipc_dir: str) -> None:
        """Listen on this gateway's answer socket in `ipc_dir` (again, when the directory moved)."""
        path = answer_path(ipc_dir, self.identity)
        if not self.answers or path is None or path == self.answer_path:
            return
        self._stop_answers()
        try:
            if os.path.exists(path):
                os.unlink(path)  # left by a killed gateway of the same identity
            old = os.umask(0o177)
            try:
                server = await asyncio.get_running_loop().create_unix_server(lambda: AnswerReader(self), path)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
        except OSError as exc:  # answers keep coming through the scheduler
            log.warning("no answer socket: answers come through the scheduler", extra={"err": str(exc)})
            return
        self._answer_server, self.answer_path = server, path

    def _stop_answers(self) -> None:
        if self._answer_server is not None:
            self._answer_server.close()
            self._answer_server = None
        if self.answer_path is not None:
            try:
                os.unlink(self.answer_path)
            except OSError:
                pass
            self.answer_path = None

    def follow(self, endpoint: str) -> None:
        path = unix_path(endpoint)
        if path != self._path and self._transport is not None:
            self._transport.close()  # the receive task reconnects to the new path
            self._transport = None
        self._path = path
        self.endpoint = endpoint
        self._followed.set()

    def _send(self, msg: list[Any], request_ids: list[str]) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            self._fail(request_ids, ConnectionError("scheduler not connected"))
            return
        if transport.get_write_buffer_size() >= MAX_QUEUED_BYTES:  # as ZeroMQ's HWM would
            self._fail(request_ids, ConnectionError("scheduler not reading its link"))
            return
        transport.writelines(encode(msg))

    async def _rx_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._followed.clear()
            if self._path is None:
                await self._followed.wait()
                continue
            await self._serve_answers(os.path.dirname(self._path))
            try:
                transport, reader = await loop.create_unix_connection(lambda: LinkReader(self), self._path)
            except OSError:
                await self._retry()
                continue
            transport.writelines(encode([HELLO, self.identity.encode()]))
            self._transport = transport
            self.connects += 1
            try:
                await reader.lost
            finally:
                if self._transport is transport:
                    self._transport = None
                transport.close()
            await self._retry()  # the scheduler went away: try again shortly

    async def _retry(self) -> None:
        """Wait ``retry_s``, or less when ``follow`` names an endpoint meanwhile."""
        try:
            await asyncio.wait_for(self._followed.wait(), self.retry_s)
        except TimeoutError:
            pass


def _expire(fut: asyncio.Future[Reply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())
