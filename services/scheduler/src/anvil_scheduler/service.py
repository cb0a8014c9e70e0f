"""The scheduler process: ROUTER for gateways, ROUTER for executors, one asyncio task per socket.

Every request that enters is answered exactly once on the socket it came from: a result, or an
Error with a code and reason (deadline, overload, unavailable). Request ids dedupe both directions.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import zmq
import zmq.asyncio
from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_core.wire import pb
from anvil_core.zmq_sockets import make_socket, tcp_endpoint

from anvil_scheduler import metrics as m
from anvil_scheduler.executors import ExecutorPool, ExecutorState
from anvil_scheduler.fifo import FifoQueues, Pending
from anvil_scheduler.settings import SchedulerSettings

__all__ = ["Scheduler"]

log = get_logger("anvil.scheduler")
_ANSWERED_MEMORY = 100_000  # request ids remembered to drop late duplicates


class Scheduler:
    def __init__(self, settings: SchedulerSettings) -> None:
        self.s = settings
        self.ctx = zmq.asyncio.Context()
        self.gw = make_socket(
            self.ctx, zmq.ROUTER, bind=tcp_endpoint(settings.bind_host, settings.gateway_port)
        )
        self.ex = make_socket(
            self.ctx, zmq.ROUTER, bind=tcp_endpoint(settings.bind_host, settings.executor_port)
        )
        self.queues = FifoQueues(settings.max_queue_per_model)
        self.pool = ExecutorPool()
        self.active: dict[str, Pending] = {}
        self.answered: OrderedDict[str, None] = OrderedDict()
        self._batch_seq = 0
        self.registry = Registry(
            settings.redis_url,
            "scheduler",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
        )

    def _fields(self) -> dict[str, Any]:
        host = self.s.advertise_host
        return {
            "gateway_endpoint": tcp_endpoint(host, self.s.gateway_port),
            "executor_endpoint": tcp_endpoint(host, self.s.executor_port),
            "executors": len(self.pool.executors),
            "queued": sum(self.queues.depth(mo) for mo in self.queues.queues),
            "models": sorted({mo for ex in self.pool.executors.values() for mo in ex.models}),
        }

    async def run(self, stop: asyncio.Event) -> None:
        serve_metrics(self.s.metrics_port, "scheduler", self.s.service_id)
        await self.registry.start()
        tasks = [
            asyncio.create_task(self._gateway_loop(), name="gateway-rx"),
            asyncio.create_task(self._executor_loop(), name="executor-rx"),
            asyncio.create_task(self._reaper_loop(), name="reaper"),
        ]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.registry.stop()
        self.gw.close()
        self.ex.close()
        self.ctx.term()

    # ---- gateways -------------------------------------------------------------------------
    async def _gateway_loop(self) -> None:
        while True:
            parts = await self.gw.recv_multipart(copy=False)
            if len(parts) < 2:
                continue
            try:
                self._admit(parts[0].bytes, parts[1], parts[2:])
            except wire.ProtocolError as exc:
                log.warning("undecodable message from a gateway", extra={"err": str(exc)})
                continue
            self._dispatch()

    def _admit(self, gateway: bytes, envelope: Any, frames: list[Any]) -> None:
        req = codec.open_request(envelope)
        rid = (req.RequestId() or b"").decode()
        model = (req.Model() or b"").decode()
        if rid in self.active or rid in self.answered:
            m.duplicates.labels(what="request").inc()
            return
        now = time.monotonic()
        remaining_s = (req.DeadlineUnixNs() - time.time_ns()) / 1e9
        p = Pending(
            rid,
            model,
            gateway,
            envelope,
            frames,
            now,
            now + remaining_s,
            trace_id=(req.TraceId() or b"").decode(),
            priority=req.Priority(),
        )
        if remaining_s <= 0:
            self._fail(p, pb.ErrorCode.DEADLINE, "deadline already passed on arrival at the scheduler")
            return
        if not self.queues.push(p):
            limit = self.s.max_queue_per_model
            self._fail(p, pb.ErrorCode.OVERLOAD, f"queue of model {model!r} holds {limit} requests")
            return
        self.active[rid] = p
        m.queue_depth.labels(model=model).set(self.queues.depth(model))

    def _send_gateway(self, gateway: bytes, parts: list[Any]) -> None:
        try:
            self.gw.send_multipart([gateway, *parts], copy=False, flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # gateway gone: nobody is waiting for this answer any more
            log.warning("gateway unreachable; answer dropped", extra={"err": str(exc)})

    def _finish(self, p: Pending, outcome: str) -> bool:
        """Mark answered; False if it already was (the answer must not be sent twice)."""
        if p.request_id in self.answered:
            m.duplicates.labels(what="answer").inc()
            return False
        self.active.pop(p.request_id, None)
        self.answered[p.request_id] = None
        if len(self.answered) > _ANSWERED_MEMORY:
            self.answered.popitem(last=False)
        m.requests.labels(model=p.model, outcome=outcome).inc()
        return True

    def _fail(self, p: Pending, code: int, reason: str) -> None:
        if not self._finish(p, wire.ERROR_NAMES.get(code, "error").lower()):
            return
        resp = codec.build_response(
            request_id=p.request_id, trace_id=p.trace_id, model=p.model, error=(code, reason)
        )
        self._send_gateway(p.gateway, [resp])

    # ---- executors ------------------------------------------------------------------------
    async def _executor_loop(self) -> None:
        while True:
            parts = await self.ex.recv_multipart(copy=False)
            ident, payload = parts[0].bytes, parts[1:]
            try:
                body, frames = wire.unpack(payload)
            except wire.ProtocolError as exc:
                log.warning("undecodable message from an executor", extra={"err": str(exc)})
                continue
            now = time.monotonic()
            if isinstance(body, pb.RegisterT):
                self._register(ident, body, now)
            elif isinstance(body, pb.HeartbeatT):
                if self.pool.seen(ident, now) is None:
                    self._send_executor(
                        ident, wire.pack(wire.error(pb.ErrorCode.UNAVAILABLE, "unregistered"))
                    )
            elif isinstance(body, pb.BatchResultT):
                self.pool.seen(ident, now)
                self._complete(ident, body, frames)
            self._dispatch()

    def _register(self, ident: bytes, reg: pb.RegisterT, now: float) -> None:
        models = {wire.text(ms.name) for ms in (reg.models or [])}
        state = ExecutorState(
            identity=ident,
            service_id=wire.text(reg.serviceId),
            device=wire.text(reg.device),
            max_batch=max(1, reg.maxBatch),
            credits=max(1, reg.credits),
            models=models,
            last_seen_s=now,
        )
        known = ident in self.pool.executors
        self.pool.upsert(state)
        m.executors.set(len(self.pool.executors))
        if not known:
            log.info("executor registered", extra={"executor": state.service_id, "models": sorted(models)})

    def _send_executor(self, ident: bytes, parts: list[Any]) -> bool:
        try:
            self.ex.send_multipart([ident, *parts], copy=False, flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def _dispatch(self) -> None:
        for model in self.queues.models_waiting():
            while self.queues.depth(model):
                ex = self.pool.pick(model)
                if ex is None:
                    break
                batch = self.queues.pop_batch(model, min(ex.max_batch, self.s.max_batch))
                self._send_batch(ex, model, batch)
            m.queue_depth.labels(model=model).set(self.queues.depth(model))

    def _send_batch(self, ex: ExecutorState, model: str, batch: list[Pending]) -> None:
        """Frames: [Batch envelope, then per request its envelope and payloads] (see infer_codec)."""
        self._batch_seq += 1
        batch_id = f"{self.s.service_id}-{self._batch_seq}"
        now = time.monotonic()
        msg = pb.BatchT()
        msg.batchId = batch_id
        msg.model = model
        msg.frameCounts = [1 + len(p.frames) for p in batch]
        msg.queueUs = [int((now - p.arrival_s) * 1e6) for p in batch]
        frames: list[Any] = []
        for p, waited_us in zip(batch, msg.queueUs, strict=True):
            frames.append(p.envelope)
            frames.extend(p.frames)
            p.attempts += 1
            m.queue_us.labels(model=model).observe(waited_us)
        ex.inflight[batch_id] = batch
        m.batches.labels(model=model).inc()
        m.batch_size.labels(model=model).observe(len(batch))
        if not self._send_executor(ex.identity, wire.pack(msg, frames)):
            self._lose_executor(ex.identity, "send failed")

    def _complete(self, ident: bytes, result: pb.BatchResultT, frames: list[Any]) -> None:
        ex = self.pool.executors.get(ident)
        batch_id = wire.text(result.batchId)
        batch = ex.inflight.pop(batch_id, None) if ex is not None else None
        if batch is None:
            m.duplicates.labels(what="batch_result").inc()  # re-dispatched already; answered elsewhere
            return
        if result.error is not None and result.error.code != pb.ErrorCode.OK:
            for p in batch:
                self._fail(p, result.error.code, wire.text(result.error.reason))
            return
        by_id = {p.request_id: p for p in batch}
        try:
            groups = list(codec.split_groups(frames, wire.ints(result.frameCounts)))
            for group in groups:
                rid = (codec.open_response(group[0]).RequestId() or b"").decode()
                found = by_id.pop(rid, None)
                if found is None:
                    m.duplicates.labels(what="response").inc()
                    continue
                if self._finish(found, "answered"):
                    self._send_gateway(found.gateway, group)  # forwarded unchanged
        except wire.ProtocolError as exc:
            log.warning(
                "malformed batch result", extra={"executor": ex.service_id if ex else "?", "err": str(exc)}
            )
        for p in by_id.values():
            self._fail(p, pb.ErrorCode.INTERNAL, "executor returned no result for this request")

    def _lose_executor(self, ident: bytes, why: str) -> None:
        orphans = self.pool.remove(ident)
        m.executors.set(len(self.pool.executors))
        log.warning(
            "executor lost",
            extra={"executor": ident.decode(errors="replace"), "why": why, "requeued": len(orphans)},
        )
        live = [p for p in orphans if p.request_id not in self.answered]
        m.redispatched.inc(len(live))
        self.queues.push_front(live)

    async def _reaper_loop(self) -> None:
        timeout_s = self.s.executor_timeout_ms / 1000
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for ident in self.pool.silent(now, timeout_s):
                self._lose_executor(ident, f"no heartbeat for {self.s.executor_timeout_ms} ms")
            for p in self.queues.expired(now):
                self._fail(p, pb.ErrorCode.DEADLINE, "deadline passed while queued")
            self._dispatch()
