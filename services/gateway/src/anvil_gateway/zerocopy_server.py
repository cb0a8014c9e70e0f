"""ZeroCopy ingress (docs/protocol.md): a ROUTER on an ipc socket, clients' shm regions, slot replies.

One asyncio task reads doorbells; every message is answered exactly once (INFER: INFER_OK or ERROR;
CANCEL: CANCEL_OK, its target ERROR CANCELLED; ...). Input bytes are never copied here: the
InferRequest sent to the scheduler names them by (region, offset, length) and the executor maps the
region itself. Results come back as frames and are written into the client's slot (the one copy).
Regions are announced in Redis (`anvil:shm:{region}`, refreshed every heartbeat) for the executor and
withdrawn on UNREGISTER once the region's requests are done, or when their owner unlinked them.

Per INFER the Python work is: one header unpack, dict lookups (region, memoized metadata + spec
check), one envelope written by the wire codec, a send. Every message is answered or counted:
whatever a doorbell makes raise is answered with an ERROR and counted in
``anvil_dropped_messages_total{service="gateway_zerocopy"}``; the loop goes on. The lifespan calls
`start()` after `link.start()` and `stop()` before `registry.stop()` / `link.stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.drops import DropLog
from anvil_core.keys import shm_key
from anvil_core.logs import get_logger
from anvil_core.model_spec import ModelSpec, SpecError
from anvil_core.tensors import HostTensor
from anvil_core.zerocopy import Flag, HeaderError, Op, Status, ZeroCopyError
from anvil_core.zerocopy import header as zh
from anvil_core.zerocopy import meta as zm
from anvil_core.zerocopy import slots as slot_io
from anvil_core.zmq_sockets import make_socket
from anvil_gateway import metrics as m
from anvil_gateway.admission import Rejected
from anvil_gateway.backend import BackendUnavailable
from anvil_gateway.state import GatewayState, NotFound
from anvil_gateway.zc_forward import request_envelope, response_outputs
from anvil_gateway.zc_regions import ServedRegion, ServedRegions

__all__ = ["SOCKET_NAME", "ZeroCopyServer"]

log = get_logger("anvil.gateway.zerocopy")

SOCKET_NAME = "anvil-zc.sock"
_CACHE_ENTRIES = 4096  # metadata blocks / result layouts remembered (cleared when full)
_EMPTY = np.empty(0, np.uint8)
# messages refused as malformed are answered and also counted as drops (drops.py), by reason
_DROP_REASON = {Status.BAD_HEADER: "undecodable", Status.BAD_OP: "undecodable"} | {
    s: "invalid" for s in (Status.BAD_REGION, Status.BAD_SLOT, Status.BAD_LENGTH, Status.BAD_META)
}

messages = Counter("anvil_zerocopy_messages_total", "ZeroCopy messages answered", ["op", "status"])
regions_gauge = Gauge("anvil_zerocopy_regions", "Registered ZeroCopy regions")


@dataclass(eq=False)
class _Flight:
    peer: bytes
    request_id: int
    reserved: int
    region: ServedRegion
    slot: int
    base: int  # slot offset in the region
    t0_ns: int
    spec: ModelSpec | None = None  # set once the request passed validation
    rows: int = 1
    task: asyncio.Task[None] | None = None
    admitted: bool = False
    done: bool = False


@dataclass(frozen=True)
class _Prepared:
    """A metadata block, decoded and checked against one spec; reused while both are unchanged."""

    meta: zm.InferMeta
    spec: ModelSpec


class ZeroCopyServer:
    def __init__(self, st: GatewayState, directory: str = "") -> None:
        self.st = st
        self.s = st.settings
        self._dir = directory  # empty: a private 0700 directory made at start
        self.endpoint = ""  # ipc://<dir>/anvil-zc.sock once started
        self._tag = secrets.token_hex(4)
        self._seq = 0  # requests sent to the scheduler
        self._regions = ServedRegions(self._tag)
        self._flights: dict[tuple[bytes, int], _Flight] = {}
        self._prepared: dict[bytes, _Prepared] = {}
        self._layouts: dict[tuple[Any, ...], zm.ResultLayout] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ctx: zmq.asyncio.Context | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self.drops = DropLog(log, "gateway_zerocopy")

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        directory = self._dir or tempfile.mkdtemp(prefix="anvil-zc-")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, SOCKET_NAME)
        if len(path.encode()) > 107:
            raise ValueError(f"zerocopy socket path is {len(path.encode())} bytes; unix sockets allow 107")
        self._ctx = zmq.asyncio.Context()
        old = os.umask(0o077)  # the socket file is born 0600 ...
        try:
            self.sock = make_socket(
                self._ctx,
                zmq.ROUTER,
                bind=f"ipc://{path}",
                max_msg_bytes=zh.HEADER_BYTES + zh.MAX_INLINE_BYTES,
            )
        finally:
            os.umask(old)
        os.chmod(path, 0o600)  # ... and stays so whatever the umask was
        self.endpoint = f"ipc://{path}"
        self._spawn(self._rx_loop())
        self._spawn(self._refresh_loop())
        log.info("zerocopy listening", extra={"endpoint": self.endpoint})

    async def stop(self) -> None:
        pending = [*self._tasks, *(f.task for f in self._flights.values() if f.task is not None)]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        keys = self._regions.close()
        regions_gauge.set(0)
        with contextlib.suppress(RedisError, OSError):
            if keys:
                await self.st.registry.redis.delete(*keys)
        if self.sock is not None:
            self.sock.close()
        if self._ctx is not None:
            self._ctx.term()
        if self.endpoint:
            path = self.endpoint[len("ipc://") :]
            with contextlib.suppress(OSError):
                os.unlink(path)
                if not self._dir:
                    os.rmdir(os.path.dirname(path))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- doorbell -----------------------------------------------------------------------------
    async def _rx_loop(self) -> None:
        assert self.sock is not None
        while True:
            parts = await self.sock.recv_multipart()
            peer = parts[0]
            try:
                if len(parts) != 2:
                    rid = zh.peek_request_id(parts[1]) if len(parts) > 1 else 0
                    raise HeaderError(Status.BAD_HEADER, "a doorbell is one frame", rid)
                head = zh.decode_request(parts[1])
                if head.op == Op.INFER:
                    self._infer(peer, head, parts[1])
                elif head.op == Op.PING:
                    self._send(peer, zh.encode(head.request_id, Op.PONG), "PING", Status.OK)
                elif head.op == Op.CANCEL:
                    self._cancel(peer, head)
                elif head.op == Op.REGISTER:
                    self._spawn(self._register(peer, head.request_id, parts[1][zh.HEADER_BYTES :]))
                else:
                    self._unregister(peer, head)
            except ZeroCopyError as exc:
                self._error(peer, exc.request_id, exc.status, exc.message)
                self._count(exc)
            except Exception as exc:  # a bug here must cost one request, never the listener
                self.drops.drop("internal", f"{type(exc).__name__}: {exc}", exc_info=True)
                self._error(peer, zh.peek_request_id(parts[-1]), Status.INTERNAL, f"gateway error: {exc}")

    def _count(self, exc: ZeroCopyError) -> None:
        reason = _DROP_REASON.get(exc.status)
        if reason is not None:
            self.drops.drop(reason, exc.message)

    def _send(self, peer: bytes, data: bytes, op: str, status: Status) -> None:
        """Non-blocking send through the asyncio socket (which then re-checks its edge-triggered
        ZMQ_FD for waiting receivers; a send on a shadow socket would leave them asleep)."""
        assert self.sock is not None
        messages.labels(op=op, status=status.name).inc()
        done: asyncio.Future[Any] = self.sock.send_multipart([peer, data], flags=zmq.NOBLOCK)  # type: ignore[assignment]
        if done.exception() is not None:  # the client went away (ROUTER_MANDATORY) or is not reading
            messages.labels(op=op, status="UNDELIVERED").inc()

    def _error(self, peer: bytes, rid: int, status: Status, text: str, flight: _Flight | None = None) -> None:
        """ERROR for `rid`: the text goes into the slot when the request owns one, else inline."""
        if flight is not None and flight.region.mapping.intact():
            hdr = slot_io.write_error(flight.region.mapping, flight.base, rid, flight.reserved, status, text)
            self._send(peer, hdr, "ERROR", status)
        else:
            body = text.encode()[: zh.MAX_INLINE_BYTES]
            self._send(peer, zh.encode(rid, Op.ERROR, len(body), Flag.INLINE, status) + body, "ERROR", status)

    # ---- REGISTER / UNREGISTER ----------------------------------------------------------------
    async def _register(self, peer: bytes, rid: int, payload: bytes) -> None:
        try:
            region = self._attach(peer, payload)
        except ZeroCopyError as exc:
            self._error(peer, rid, exc.status, exc.message)
            self._count(exc)
            return
        try:
            await self._announce([region])
        except (RedisError, OSError):
            self._forget(region)
            self._error(peer, rid, Status.UNAVAILABLE, "registry (redis) unreachable; region not registered")
            return
        log.info("zerocopy region registered", extra={"region": region.key, "bytes": region.mapping.size})
        self._send(peer, zh.encode(rid, Op.REGISTER_OK, reserved=region.id << 16), "REGISTER", Status.OK)

    def _attach(self, peer: bytes, payload: bytes) -> ServedRegion:
        slot_bytes, slot_count, name, api_key = slot_io.decode_register(payload)
        try:
            tenant = self.st.admission.tenant({"x-api-key": api_key} if api_key else {})
        except Rejected as exc:
            raise ZeroCopyError(Status.UNAUTHORIZED, f"{exc} (REGISTER payload)") from None
        region = self._regions.attach(peer, slot_bytes, slot_count, name, tenant)
        regions_gauge.set(len(self._regions))
        return region

    async def _announce(self, regions: list[ServedRegion]) -> None:
        ttl_ms = max(int(self.s.heartbeat_ttl_s * 1000), 1000)
        await self._regions.announce(self.st.registry.redis, regions, ttl_ms, self.s.service_id)

    def _unregister(self, peer: bytes, head: zh.Header) -> None:
        region = self._regions.owned(peer, head.region, head.request_id)
        region.closing = True
        region.waiters.append(head.request_id)
        if not region.busy:
            self._forget(region)

    def _forget(self, region: ServedRegion) -> None:
        """Drop a drained region: unmap now, withdraw its key and answer its UNREGISTERs next."""
        if self._regions.drop(region):
            regions_gauge.set(len(self._regions))
            self._spawn(self._withdraw(region))

    async def _withdraw(self, region: ServedRegion) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.st.registry.redis.delete(shm_key(region.key))
        for rid in region.waiters:
            self._send(region.peer, zh.encode(rid, Op.UNREGISTER_OK), "UNREGISTER", Status.OK)
        log.info("zerocopy region unregistered", extra={"region": region.key})

    async def _refresh_loop(self) -> None:
        """Every heartbeat: drop regions whose owner unlinked or shrank them, refresh the rest."""
        while True:
            await asyncio.sleep(self.s.heartbeat_interval_s)
            for region in self._regions.gone():
                region.closing = True
                if not region.busy:
                    self._forget(region)
            with contextlib.suppress(RedisError, OSError):
                if live := [r for r in self._regions if not r.closing]:
                    await self._announce(live)

    # ---- INFER --------------------------------------------------------------------------------
    def _infer(self, peer: bytes, head: zh.Header, frame: bytes) -> None:
        t0_ns = time.perf_counter_ns()
        rid = head.request_id
        region = self._regions.owned(peer, head.region, rid)
        if region.closing:
            raise ZeroCopyError(Status.BAD_REGION, f"region {region.id} is being unregistered", rid)
        mapping = region.mapping
        try:
            base = mapping.check_payload(head.slot, head.payload_length)
        except ZeroCopyError as exc:
            raise ZeroCopyError(exc.status, exc.message, rid) from None
        if head.slot in region.busy:
            raise ZeroCopyError(Status.SLOT_BUSY, f"slot {head.slot} has a request in flight", rid)
        if (peer, rid) in self._flights:
            raise ZeroCopyError(Status.DUPLICATE, f"request id {rid} is already in flight", rid)
        if not mapping.intact():
            raise ZeroCopyError(Status.BAD_REGION, "region was shrunk by its owner", rid)
        flight = _Flight(peer, rid, head.reserved, region, head.slot, base, t0_ns)
        try:
            if mapping.get(base, zh.HEADER_BYTES) != frame:
                raise ZeroCopyError(Status.BAD_SLOT, "the slot's header differs from the doorbell's")
            payload = mapping.get(base + zh.HEADER_BYTES, head.payload_length)
            prepared = self._prepare(zm.read_block(payload, head.payload_length), head.payload_length)
        except ZeroCopyError as exc:
            self._fail(flight, exc.status, exc.message)
            self._count(exc)
            return
        meta, spec = prepared.meta, prepared.spec
        flight.spec = spec
        flight.rows = meta.inputs[0].shape[0] if spec.max_batch > 0 and meta.inputs[0].shape else 1
        priority = meta.priority or self.s.default_priority
        budget_s = self.s.slo_ms(priority) / 1000
        if meta.timeout_us:
            budget_s = min(budget_s, meta.timeout_us / 1e6)
        try:
            self.st.admission.admit(spec.name, region.tenant, priority, time.monotonic())
        except Rejected as exc:
            labels = {"tenant": region.tenant, "priority": str(priority), "reason": exc.reason}
            m.admission_rejected.labels(**labels).inc()
            self._fail(flight, Status.OVERLOAD, f"{exc} (retry after {exc.retry_after_s:.3f} s)")
            return
        # from here on nothing raises: the request is in flight and _finish releases what it holds
        flight.admitted = True
        self._seq += 1
        request_id = f"{self._tag}{self._seq:024x}"
        deadline_ns = time.time_ns() + int(budget_s * 1e9)
        envelope = request_envelope(
            request_id=request_id,
            trace_id=meta.trace_id or os.urandom(16).hex(),
            model=spec.name,
            version=meta.model_version,  # "" unless named: a redeploy's new version answers it
            priority=priority,
            deadline_unix_ns=deadline_ns,
            tenant=region.tenant,
            region=region.key,
            slot_base=base,
            inputs=[(t.name, t.datatype, t.shape, t.offset, t.length) for t in meta.inputs],
            outputs=meta.outputs,
        )
        region.busy[head.slot] = flight
        self._flights[(peer, rid)] = flight
        m.inflight.inc()
        direct_model = "" if meta.model_version else spec.name  # a version named: never direct
        flight.task = asyncio.get_running_loop().create_task(
            self._run(flight, request_id, envelope, budget_s, priority == 1, direct_model, flight.rows)
        )

    def _prepare(self, block: bytes, payload_length: int) -> _Prepared:
        """Decode + validate a metadata block against its model's current spec, memoized."""
        prepared = self._prepared.get(block)
        if prepared is None or self.st.discovery.models.get(prepared.meta.model) != prepared.spec:
            meta = zm.decode_infer(block)
            try:
                spec = self.st.lookup(meta.model, meta.model_version or None)
            except NotFound as exc:
                raise ZeroCopyError(Status.NOT_FOUND, str(exc)) from None
            try:
                spec.validate([HostTensor(t.name, t.datatype, t.shape, _EMPTY) for t in meta.inputs])
            except SpecError as exc:
                raise ZeroCopyError(Status.BAD_REQUEST, str(exc)) from None
            unknown = [o for o in meta.outputs if o not in {t.name for t in spec.outputs}]
            if unknown:
                raise ZeroCopyError(Status.BAD_REQUEST, f"model {meta.model!r} has no outputs {unknown}")
            if len(self._prepared) >= _CACHE_ENTRIES:
                self._prepared.clear()
            prepared = self._prepared[block] = _Prepared(meta, spec)
        if prepared.meta.end > zh.HEADER_BYTES + payload_length:
            raise ZeroCopyError(
                Status.BAD_LENGTH, f"inputs end at slot byte {prepared.meta.end}, past the payload"
            )
        return prepared

    async def _run(
        self,
        flight: _Flight,
        request_id: str,
        envelope: bytes,
        budget_s: float,
        urgent: bool,
        model: str,
        rows: int,
    ) -> None:
        """`model`: "" when the request named a version (it never goes to an executor directly)."""
        try:
            link = self.st.link
            resp, frames = await link.infer(request_id, [envelope], budget_s + 0.05, urgent, model, rows)
            if not flight.done:
                self._deliver(flight, resp, frames)
        except BackendUnavailable as exc:
            self._fail(flight, Status.UNAVAILABLE, f"model unavailable: {exc}")
        except TimeoutError:
            self._fail(flight, Status.DEADLINE, f"no answer within the deadline ({budget_s * 1e3:.0f} ms)")
        except asyncio.CancelledError:
            pass  # CANCEL answered it, or the gateway is stopping
        except ZeroCopyError as exc:
            self._fail(flight, exc.status, exc.message)
        except Exception as exc:
            log.exception("zerocopy delivery failed")
            self._fail(flight, Status.INTERNAL, f"gateway error: {exc}")
        finally:
            self._finish(flight)

    def _deliver(self, flight: _Flight, resp: Any, frames: list[Any]) -> None:
        """Write the outputs and the INFER_OK header into the slot, then ring the client."""
        spec = flight.spec
        assert spec is not None
        err = resp.error
        if err is not None and err.code != pb.ErrorCode.OK:
            kind = codec.ERROR_NAMES.get(err.code, "ERROR").lower()
            status = Status(err.code) if err.code in Status._value2member_map_ else Status.INTERNAL
            self._fail(flight, status, f"{kind}: {err.reason or ''}")
            return
        tensors, buffers = response_outputs(resp, frames)
        key = (spec.name, spec.version, tuple(tensors))
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= _CACHE_ENTRIES:
                self._layouts.clear()
            layout = self._layouts[key] = zm.result_layout(spec.name, spec.version, tensors)
        region = flight.region.mapping
        if not region.intact():
            raise ZeroCopyError(Status.BAD_REGION, "region was shrunk by its owner")
        queue_us, compute_us = resp.queueUs, resp.computeUs
        hdr = slot_io.write_result(
            region, flight.base, flight.request_id, flight.reserved, layout, buffers, queue_us, compute_us
        )
        self._send(flight.peer, hdr, "INFER", Status.OK)
        total_ns = time.perf_counter_ns() - flight.t0_ns
        name, version = spec.name, spec.version
        self.st.stats.success(name, version, flight.rows, total_ns, resp)
        m.record_success(name, version, flight.rows, total_ns / 1000, queue_us, compute_us)

    def _fail(self, flight: _Flight, status: Status, text: str) -> None:
        if flight.done:
            return
        self._error(flight.peer, flight.request_id, status, text, flight)
        if flight.spec is not None:
            name, version = flight.spec.name, flight.spec.version
            m.failure.labels(model=name, version=version, reason=status.name.lower()).inc()
            self.st.stats.failure(name, version, time.perf_counter_ns() - flight.t0_ns)

    def _finish(self, flight: _Flight) -> None:
        """Release the slot (idempotent); a closing region whose last request this was is dropped."""
        if flight.done:
            return
        flight.done = True
        if flight.admitted and flight.spec is not None:
            self.st.admission.done(flight.spec.name)
        if flight.task is not None:
            m.inflight.dec()
        self._flights.pop((flight.peer, flight.request_id), None)
        region = flight.region
        region.busy.pop(flight.slot, None)
        if region.closing and not region.busy:
            self._forget(region)

    # ---- CANCEL -------------------------------------------------------------------------------
    def _cancel(self, peer: bytes, head: zh.Header) -> None:
        flight = self._flights.get((peer, head.reserved))
        if flight is None:
            raise ZeroCopyError(
                Status.NOT_FOUND, f"request {head.reserved} is not in flight", head.request_id
            )
        if flight.task is not None:
            flight.task.cancel()
        self._fail(flight, Status.CANCELLED, "cancelled by the client")
        self._finish(flight)
        self._send(peer, zh.encode(head.request_id, Op.CANCEL_OK), "CANCEL", Status.OK)
