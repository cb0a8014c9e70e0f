"""The scheduler process: a ZeroMQ poll loop over two ROUTER sockets driving `SchedulerCore`.

One thread owns both sockets and the core (whose calls must come from one thread with a monotonic
clock); Redis chores (registry beat, profiles and SLO attainment) run on a background loop fed with
snapshots. Every request that enters is answered exactly once on the socket it came from: the
executor's response group forwarded unchanged, or an Error (deadline, overload, unavailable).

No message can stop the loop (issue #18): every message is verified by the wire codec before a field
is used (``anvil_core.codec``: offsets, strings, enums, priority, deadline, ids, then the payload
frames), a refused request is answered with BAD_REQUEST when its id still reads, and whatever still
raises while handling one message is caught, counted in ``anvil_dropped_messages_total`` and logged
(rate-limited); the loop goes on with the next message.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from anvil_core import codec, deployments, keys, tracing
from anvil_core.background import Background
from anvil_core.codec import pb
from anvil_core.drops import DropLog
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_core.zmq_auth import CurveGate
from anvil_core.zmq_sockets import ipc_endpoint, make_socket, tcp_endpoint
from anvil_scheduler import metrics as m
from anvil_scheduler import snapshot, spans
from anvil_scheduler.core import (
    AdmitOutcome,
    AimdPolicy,
    BatchingPolicy,
    EdfPidPolicy,
    ExecutorSpec,
    FixedDelayConfig,
    FixedDelayPolicy,
    Release,
    Request,
    SchedulerCore,
    Shed,
)
from anvil_scheduler.host_cpu import HostCpu
from anvil_scheduler.settings import SchedulerSettings
from anvil_scheduler.tickets import SHED_CODES, SHED_TEXT, Ticket, reply_to, ticket_of
from anvil_scheduler.unix_links import UnixLinks
from anvil_scheduler.unloaded import UnloadedView

__all__ = ["Scheduler"]

_POLL_IN = int(zmq.POLLIN)  # a plain int: `&` on the IntFlag member costs ~1 µs (enum.Flag)
log = get_logger("anvil.scheduler")
_DRAIN = 256  # messages taken from one socket per loop turn, so neither side starves


def make_policy(s: SchedulerSettings) -> BatchingPolicy:
    if s.policy == "fixed_delay":
        return FixedDelayPolicy(FixedDelayConfig(s.fixed_max_batch, s.fixed_max_queue_delay_us))
    if s.policy == "aimd":
        return AimdPolicy()
    return EdfPidPolicy()


class Scheduler:
    def __init__(self, settings: SchedulerSettings) -> None:
        self.s = settings
        self.ctx = zmq.Context()
        # CURVE (issue #18): each port admits its own role's keys only; the gate runs before binding
        self.gate: CurveGate | None = None
        if settings.zmq_curve:
            admitted = {role: settings.curve_admitted(role) for role in ("gateway", "executor")}
            self.gate = CurveGate(self.ctx, "scheduler", admitted)
            self.gate.start()
        if settings.link_ipc_dir:  # one host: only this user may enter (zmq_sockets)
            Path(settings.link_ipc_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(settings.link_ipc_dir, 0o700)
        self.gw = self._router(settings.gateway_port, "gateway")
        self.ex = self._router(settings.executor_port, "executor")
        # One host: the same links over Unix stream sockets too (anvil_core.unix_link: no ZeroMQ I/O
        # threads); a peer uses them with ANVIL_LINK_TRANSPORT=unix, either kind is served.
        self.links = UnixLinks(settings.link_ipc_dir) if settings.link_ipc_dir else None
        self.core = SchedulerCore(make_policy(settings), settings.core_config())
        # the host's CPU busy fraction, for the CPU batching window (sampled with the chores)
        self.host_cpu = HostCpu() if settings.cpu_window_us and settings.policy == "edf_pid" else None
        self.executors: dict[str, bytes] = {}  # executor id -> ROUTER identity
        self.last_seen: dict[str, float] = {}
        self.sent_at: dict[int, float] = {}  # batch id -> monotonic send time
        self.bg = Background("scheduler-redis")
        self.registry = Registry(
            settings.redis_url,
            "scheduler",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
            auth=settings.redis_auth,
        )
        self._snapshot: dict[str, Any] = snapshot.EMPTY
        self._next_snapshot = 0.0
        self._priorities = frozenset(p.priority for p in self.core.config.priorities)
        self.drops = DropLog(log, "scheduler")
        self._depth_labels: set[tuple[str, int]] = set()  # queue-depth series ever set, reset to 0
        # Models the registry marks UNLOADED (undeployed/unloaded): removed from the core, and
        # ignored in executors' registrations until deployed again (read every model_sync_interval;
        # unloaded.py: a stale read is not applied, a request for one waits for a fresh read).
        self.unloads = UnloadedView()
        # each executor's last Register, to apply again when a model it lists is deployed again
        self._registrations: dict[str, tuple[bytes, pb.RegisterT]] = {}
        self._hop_series: dict[tuple[str, int], Any] = {}
        self._label_cache: dict[tuple[Any, ...], Any] = {}  # (metric id, *labels) -> its series

    def _router(self, port: int, link: str) -> zmq.Socket[bytes]:
        """A ROUTER for the clients of `link` (gateway or executor): tcp with CURVE, and the ipc
        socket of one host when configured; ROUTER_MANDATORY: an unknown identity raises instead
        of dropping (make_socket)."""
        endpoint = tcp_endpoint(self.s.link_bind_host, port)
        ipc = ipc_endpoint(self.s.link_ipc_dir, link) if self.s.link_ipc_dir else None
        curve = self.s.curve_server(link)
        sock = make_socket(self.ctx, zmq.ROUTER, bind=endpoint, curve=curve, plain_bind=ipc)
        if self.gate is not None:
            self.gate.watch(sock, link)
        return sock

    def _fields(self) -> dict[str, Any]:
        host = self.s.advertise_host
        return {
            "gateway_endpoint": tcp_endpoint(host, self.s.gateway_port),
            "executor_endpoint": tcp_endpoint(host, self.s.executor_port),
            "executors": len(self.executors),
            "policy": self.s.policy,
            "models": sorted(self.core.models()),
            # models that a connected executor serves now: the gateway's readiness waits for this
            "served": sorted({m for spec in self.core.pool.specs() for m in spec.models}),
        }

    # ---- loop ---------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        serve_metrics(self.s.metrics_port, "scheduler", self.s.service_id)
        self.bg.submit(self.registry.start()).result(10)
        self.bg.every(self.s.publish_interval_ms / 1000, self._publish)
        self.bg.every(self.s.model_sync_interval_ms / 1000, self._read_unloaded)
        poller = zmq.Poller()
        poller.register(self.gw, zmq.POLLIN)
        poller.register(self.ex, zmq.POLLIN)
        next_wake: float | None = None
        next_chores = 0.0
        while not stop.is_set():
            now = time.monotonic()
            wait_s = 0.05 if next_wake is None else min(0.05, max(0.0, next_wake - now))
            # Round up: zmq polls in whole ms, and int() made every wake-up under 1 ms away a spin
            # (EDF+PID wakes at the predicted end of the running batch, often < 1 ms ahead on a fast
            # model: the scheduler then burnt a core that the gateway needed, #19). Late by < 1 ms.
            if self.links is not None:
                self.links.watch(poller)
            events = dict(poller.poll(math.ceil(wait_s * 1000)))
            if self.gw in events:
                self._drain(self.gw, self._on_gateway)
            if self.ex in events:
                self._drain(self.ex, self._on_executor)
            if self.links is not None and len(events) > (self.gw in events) + (self.ex in events):
                self.links.serve(events, self._from_gateway, self._from_executor, self._link_problem)
            now = time.monotonic()
            if now >= next_chores:
                self._chores(now)
                next_chores = now + 0.05
            next_wake = self._poll_core(now)
        self.bg.submit(self.registry.stop()).result(5)
        self.bg.stop()
        self.gw.close()
        self.ex.close()
        if self.links is not None:
            self.links.close()
        if self.gate is not None:
            self.gate.stop()  # before term: its ZAP socket would hold term() forever
        self.ctx.term()

    def _drain(self, sock: zmq.Socket[bytes], handle: Any) -> None:
        # Ask the socket whether a message is there rather than receive until zmq.Again: raising and
        # catching that costs more than the check (about one per message at moderate load).
        for _ in range(_DRAIN):
            if not int(sock.get(zmq.EVENTS)) & _POLL_IN:
                return
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.handle(handle, parts)

    def _from_gateway(self, parts: list[Any]) -> None:
        self.handle(self._on_gateway, parts)

    def _from_executor(self, parts: list[Any]) -> None:
        self.handle(self._on_executor, parts)

    def _link_problem(self, reason: str, detail: str) -> None:
        if reason == "closed":  # a peer went away: not a refused message
            log.info("unix link closed", extra={"detail": detail})
        else:
            self.drops.drop(reason, detail)

    def handle(self, handler: Any, parts: list[Any]) -> None:
        """One received message ([identity, *frames]: the identity a zmq.Frame from a ROUTER, bytes
        from a Unix link); nothing it contains can end the loop."""
        try:
            if len(parts) < 2:
                raise codec.ProtocolError(f"{len(parts)} frames: need an identity and an envelope")
            ident = parts[0] if isinstance(parts[0], bytes) else parts[0].bytes
            handler(ident, parts[1:])
        except codec.ProtocolError as exc:
            self.drops.drop(exc.reason, str(exc))
        except Exception as exc:  # a bug or a crafted message we did not foresee: log it, keep serving
            self.drops.drop("internal", f"{type(exc).__name__}: {exc}", exc_info=True)

    def _poll_core(self, now: float) -> float | None:
        decision = self.core.poll(now)
        for shed in decision.shed:
            self._answer_shed(shed)
        for batch in decision.batches:
            self._send_batch(batch, now)
        return decision.next_wakeup_s

    # ---- gateways -----------------------------------------------------------------------------
    def _on_gateway(self, gateway: bytes, parts: list[Any]) -> None:
        """One request, or a bundle of the requests the gateway gathered in one loop turn."""
        for body, group in codec.unbundle(parts):
            try:
                self._on_request(gateway, body, group)
            except codec.ProtocolError as exc:  # one bad request spoils none of its neighbours
                self._refuse(gateway, group[0], exc)
                self.drops.drop(exc.reason, str(exc))

    def _on_request(self, gateway: bytes, body: Any, parts: list[Any]) -> None:
        if isinstance(body, codec.ProtocolError):
            raise body
        if not isinstance(body, pb.InferRequestT):
            raise codec.ProtocolError(f"a gateway sent a {type(body).__name__}", "unexpected")
        req: Any = body  # verified: ids and model are non-empty str, priority 1..3, deadline >= 0
        codec.check_payloads(req.inputs, parts[1:], "input")
        rid, model = req.requestId, req.model
        ticket = Ticket(gateway, parts[0], parts[1:], req.traceId or "", req.traceparent or "")
        now = time.monotonic()
        remaining_s = (req.deadlineUnixNs - time.time_ns()) / 1e9
        if remaining_s <= 0:
            self._reply_error(
                ticket, rid, model, pb.ErrorCode.DEADLINE, "deadline passed before it reached the scheduler"
            )
            return
        if model in self.unloads.models:
            ask = self.unloads.park(now, model, ticket, rid, gateway, body, parts)
            if ask is None:  # MAX_PARKED already wait
                self._reply_error(
                    ticket, rid, model, pb.ErrorCode.NOT_FOUND, f"model {model!r} is not deployed"
                )
            elif ask:
                self.bg.submit(self._read_unloaded())
            return
        if self.core.has_model(model):
            self.unloads.seen(model, now)
        if not self.core.has_model(model):
            self._reply_error(
                ticket, rid, model, pb.ErrorCode.UNAVAILABLE, f"no executor has served model {model!r}"
            )
            return
        request = self.core.new_request(rid, model, req.priority, now, timeout_s=remaining_s, payload=ticket)
        admission = self.core.admit(request, now)
        if admission.outcome is AdmitOutcome.DUPLICATE:
            m.duplicates.labels(what="request").inc()
        for shed in admission.shed:
            self._answer_shed(shed)

    def _refuse(self, gateway: bytes, envelope: Any, exc: codec.ProtocolError) -> None:
        """Answer a refused request with BAD_REQUEST if its id (and trace id) still verify."""
        ids = codec.peek_request_ids(envelope)
        if ids is None:
            return  # no id to answer to: counted and logged by the caller
        env = codec.build_response(
            request_id=ids[0], trace_id=ids[1], model="", error=(pb.ErrorCode.BAD_REQUEST, f"refused: {exc}")
        )
        self._send_to(gateway, [env])

    def _send_to(self, gateway: bytes, parts: list[Any]) -> None:
        if self.links is not None and self.links.gateway.send(gateway, parts):
            return
        try:
            self.gw.send_multipart([gateway, *parts], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # the gateway is gone: nobody waits for this answer any more
            log.warning("gateway unreachable; answer dropped", extra={"err": str(exc)})

    def _label(self, model: str) -> str:
        """The metric label of `model`: itself while it is registered, else `_unknown`. No series per
        crafted name, and none brought back by a batch that was in flight when its model was undeployed
        (its answers arrive after `_remove_unloaded` forgot the model's series)."""
        return model if self.core.has_model(model) else "_unknown"

    def _reply_error(self, ticket: Ticket, rid: str, model: str, code: int, reason: str) -> None:
        m.requests.labels(
            model=self._label(model), outcome=codec.ERROR_NAMES.get(code, "error").lower()
        ).inc()
        env = codec.build_response(
            request_id=rid, trace_id=ticket.trace_id, model=model, error=(code, reason)
        )
        self._send_to(ticket.gateway, [env])

    def _answer_shed(self, shed: Shed) -> None:
        r = shed.request
        m.shed.labels(model=r.model, reason=shed.reason.value, priority=str(r.priority)).inc()
        self._reply_error(
            ticket_of(r), r.request_id, r.model, SHED_CODES[shed.reason], SHED_TEXT[shed.reason]
        )

    # ---- executors ----------------------------------------------------------------------------
    def _on_executor(self, ident: bytes, parts: list[Any]) -> None:
        body, frames = codec.unpack(parts)
        now = time.monotonic()
        eid = ident.decode(errors="replace")
        if isinstance(body, pb.RegisterT):
            self._register(ident, body, now)
        elif isinstance(body, pb.HeartbeatT | pb.BatchResultT) and self.executors.get(eid) != ident:
            # not registered (the scheduler restarted, or not an executor at all): ask it to register;
            # a result from it belongs to no batch this scheduler sent
            self._send_executor(ident, codec.pack(codec.error(pb.ErrorCode.UNAVAILABLE, "unregistered")))
            if isinstance(body, pb.BatchResultT):
                raise codec.ProtocolError(f"batch result from unregistered executor {eid!r}", "unregistered")
        elif isinstance(body, pb.HeartbeatT):
            self.last_seen[eid] = now
        elif isinstance(body, pb.BatchResultT):
            self.last_seen[eid] = now
            self._complete(eid, body, frames, now)
        else:
            raise codec.ProtocolError(
                f"executor {eid!r} sent a {type(body).__name__}, which executors do not send", "unexpected"
            )

    def _register(self, ident: bytes, reg: pb.RegisterT, now: float) -> None:
        eid = ident.decode(errors="replace")
        models = {n: b for n, b in _registered_models(reg).items() if n not in self.unloads.models}
        self._registrations[eid] = (ident, reg)
        for name, max_batch in models.items():
            if name not in self.core.models():
                self.core.register_model(name, max_batch)
        lanes = max(1, reg.lanes)  # 0: an executor from before lanes (the codec caps it at 16)
        spec = ExecutorSpec(
            eid, reg.device or "cpu", max(1, reg.maxBatch), frozenset(models), max(1, reg.credits), lanes
        )
        self.core.register_executor(spec, now)
        if eid not in self.executors:
            log.info("executor registered", extra={"executor": eid, "models": sorted(models)})
        self.executors[eid] = ident
        self.last_seen[eid] = now
        m.executors.set(len(self.executors))
        for name in models:
            if not self.core.profiles.get(name, spec.device).export_us():
                self.bg.submit(self._load_profile(name, spec.device))

    def _send_executor(self, ident: bytes, parts: list[Any]) -> bool:
        if self.links is not None and self.links.executor.send(ident, parts):
            return True
        try:
            self.ex.send_multipart([ident, *parts], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError:
            return False

    def _send_batch(self, batch: Any, now: float) -> None:
        """Frames: [Batch envelope, then per request its envelope and payloads] (codec.messages)."""
        counts: list[int] = []
        queue_us: list[int] = []
        frames: list[Any] = []
        for r in batch.requests:
            ticket = ticket_of(r)
            counts.append(1 + len(ticket.frames))
            queue_us.append(int((now - r.arrival_s) * 1e6))
            frames.append(ticket.envelope)
            frames.extend(ticket.frames)
        msg = pb.BatchT(batchId=str(batch.batch_id), model=batch.model, frameCounts=counts, queueUs=queue_us)
        msg.sentUnixNs = time.time_ns()  # per-hop timing: the executor echoes it in every answer
        names = self._reply_to(batch)
        if names is not None:
            msg.replyTo = list[str | None](names)
        if tracing.ON:
            contexts = [ticket_of(r).traceparent for r in batch.requests]
            msg.traceparent = spans.record(batch, contexts, now, batch.executor_id)
        self.sent_at[batch.batch_id] = now
        ident = self.executors.get(batch.executor_id)
        if ident is None or not self._send_executor(ident, codec.pack(msg, frames)):
            self._lose(batch.executor_id, "send failed", now)
        # accounted once the batch is on its way: the executor starts while these run
        for r, queued_us in zip(batch.requests, queue_us, strict=True):
            self._hop("queue", r.priority).observe(queued_us)
        self._series(m.batches, batch.model).inc()
        self._series(m.batch_size, batch.model).observe(batch.size)

    def _reply_to(self, batch: Any) -> list[str] | None:
        """Per request, its gateway's identity where the executor can answer that gateway itself
        (direct answers: both on this host's Unix links), else ""; None when none can."""
        if not self.s.direct_answers or self.links is None:
            return None
        if self.executors.get(batch.executor_id) not in self.links.executor.conns:
            return None  # an executor over ZeroMQ (maybe another host): it cannot reach the sockets
        return reply_to(batch.requests, self.links.gateway.conns)

    def _complete(self, eid: str, result: pb.BatchResultT, frames: list[Any], now: float) -> None:
        raw_id = result.batchId or ""
        if not raw_id.isdigit():
            raise codec.ProtocolError(f"batch id {raw_id!r} is not one this scheduler issues", "invalid")
        batch_id = int(raw_id)
        sent = self.sent_at.pop(batch_id, now)
        if result.error is not None and result.error.code != pb.ErrorCode.OK:
            code, reason = result.error.code, result.error.reason or ""
            retryable = code in (pb.ErrorCode.UNAVAILABLE,)
            self._release(self.core.on_batch_failed(batch_id, eid, now, retryable=retryable), code, reason)
            return
        # The profile learns the executor's own time; the round trip also holds waits behind the
        # batch already in flight there (credits), which the dispatcher predicts separately.
        done = self.core.on_batch_done(batch_id, eid, result.computeUs / 1e6, now)
        if done.late:
            m.duplicates.labels(what="late_result").inc(len(done.late))
        answered = {r.request_id: r for r in done.answered}
        rtt_us = (now - sent) * 1e6
        if answered:
            self._series(m.batch_rtt_us, self._label(done.answered[0].model)).observe(rtt_us)
        replies: dict[bytes, list[list[Any]]] = {}  # gateway -> response groups, forwarded unchanged

        def take(rid: str | None) -> Request | None:
            """The batch's request `rid`, counted answered; None if it is none of them (or twice)."""
            r = answered.pop(rid or "", None)
            if r is not None:
                self._series(m.requests, self._label(r.model), "answered").inc()
                self._hop("executor_round_trip", r.priority).observe(rtt_us)
            return r

        for rid in result.deliveredIds or ():  # answered on their gateways' answer sockets already
            take(rid)
        try:
            for group in codec.split_groups(frames, result.frameCounts or ()):
                resp = codec.read_response(group[0])  # verified before it is forwarded
                codec.check_payloads(resp.outputs, group[1:], "output")
                if (r := take(resp.requestId)) is not None:
                    replies.setdefault(ticket_of(r).gateway, []).append(group)
        except codec.ProtocolError as exc:  # the batch's requests still get an answer below
            self.drops.drop(exc.reason, f"malformed batch result from {eid!r}: {exc}")
        for gateway, groups in replies.items():  # one message per gateway for the whole batch
            self._send_to(gateway, codec.bundle(groups, responses=True))
        for r in answered.values():
            self._reply_error(
                ticket_of(r),
                r.request_id,
                r.model,
                pb.ErrorCode.INTERNAL,
                "executor returned no result for this request",
            )

    def _series(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, resolved once per label set (prometheus_client's lookup takes a
        lock and validates the labels: several µs per call, several calls per request). Forgotten
        with the model (`_remove_unloaded`)."""
        key = (id(metric), *labels)
        series = self._label_cache.get(key)
        if series is None:
            series = self._label_cache[key] = metric.labels(*labels)
        return series

    def _hop(self, hop: str, priority: int) -> Any:
        """The hop histogram of (hop, priority), resolved once (priorities are the configured ones)."""
        series = self._hop_series.get((hop, priority))
        if series is None:
            series = self._hop_series[(hop, priority)] = m.hop_us.labels(hop=hop, priority=str(priority))
        return series

    def _release(self, rel: Release, code: int, reason: str) -> None:
        m.redispatched.inc(len(rel.requeued))
        for r in rel.failed:
            self._reply_error(ticket_of(r), r.request_id, r.model, code, reason)
        for shed in rel.shed:
            self._answer_shed(shed)

    def _lose_unlinked(self, now: float) -> None:
        """An executor whose Unix link ended is lost now, not after `executor_timeout_ms` without a
        heartbeat (ZeroMQ cannot tell; a socket can): its batches in flight are re-dispatched at
        once. A restarted executor's new connection replaces the old one without ending it here."""
        if self.links is None:
            return
        for ident in self.links.executor.take_lost():
            eid = ident.decode(errors="replace")
            if self.executors.get(eid) == ident and ident not in self.links.executor.conns:
                self._lose(eid, "its link closed", now)

    def _lose(self, eid: str, why: str, now: float) -> None:
        self.executors.pop(eid, None)
        self._registrations.pop(eid, None)
        self.last_seen.pop(eid, None)
        for batch in self.core.pool.in_flight(eid):
            self.sent_at.pop(batch.batch_id, None)  # its result, if it still comes, is a late one
        m.executors.set(len(self.executors))
        rel = self.core.on_executor_lost(eid, now)
        log.warning("executor lost", extra={"executor": eid, "why": why, "requeued": len(rel.requeued)})
        self._release(rel, pb.ErrorCode.INTERNAL, f"executor lost ({why}) and the request is out of attempts")

    # ---- periodic -----------------------------------------------------------------------------
    def _chores(self, now: float) -> None:
        self.bg.drain()
        self._remove_unloaded(now)  # the loop's clock: the core's must never go back
        timeout_s = self.s.executor_timeout_ms / 1000
        for eid, seen in list(self.last_seen.items()):
            if now - seen > timeout_s:
                self._lose(eid, f"no heartbeat for {self.s.executor_timeout_ms} ms", now)
        self._export_accounting(now)
        if self.host_cpu is not None:
            busy = self.host_cpu.sample()
            m.host_cpu_busy.set(busy)
            m.cpu_window_us.set(self.core.set_host_cpu(busy) * 1e6)
        if self.links is not None:
            self.links.export()
            self._lose_unlinked(now)
        policy = self.core.policy
        for model in self.core.models():
            m.target_batch.labels(model=model).set(self.core.target_batch(model))
            if isinstance(policy, EdfPidPolicy) and policy.has_loop(model):
                m.pid_measured.labels(model=model).set(policy.measured(model) or 0.0)
                m.batch_ceiling.labels(model=model).set(policy.ceiling(model))
        if now >= self._next_snapshot:  # what _publish sends; sorting the p99 window is not free
            self._next_snapshot = now + self.s.publish_interval_ms / 1000
            self._snapshot = snapshot.take(self.core, now)

    def _export_accounting(self, now: float) -> None:
        """Queue, in-flight and open-request state as gauges: all zero when the stack is idle."""
        depth = self.core.queue_depth()
        self._depth_labels |= depth.keys()
        for model, priority in self._depth_labels:  # a drained queue reads 0, not its last depth
            m.queue_depth.labels(model=model, priority=str(priority)).set(depth.get((model, priority), 0))
        acc = self.core.accounting(now)
        m.in_flight_batches.set(acc.in_flight_batches)
        m.in_flight_requests.set(acc.in_flight_requests)
        m.open_requests.set(acc.open_requests)
        m.work_ahead_us.set(acc.work_ahead_s * 1e6)
        m.awaiting_result_batches.set(len(self.sent_at))

    async def _publish(self) -> None:
        await snapshot.publish(self.registry.redis, self._snapshot)

    async def _read_unloaded(self) -> None:
        """Background loop: the models marked unloaded in the registry (anvil_core.deployments)."""
        started = time.monotonic()
        found = frozenset(await deployments.unloaded(self.registry.redis))
        self.bg.post(lambda: self.unloads.apply(found, started))  # applied by the next _chores

    def _remove_unloaded(self, now: float) -> None:
        """Scheduler thread: drop the models just undeployed; every request still queued for one is
        answered NOT_FOUND now (in-flight batches are answered when their executor reports). A model
        deployed again is taken back from the registrations of the executors that list it."""
        revived = self.unloads.revived()
        for ident, reg in list(self._registrations.values()):
            if revived & set(_registered_models(reg)):
                self._register(ident, reg, now)
        for model in self.unloads.models & set(self.core.models()):
            failed = self.core.remove_model(model, now)
            why = f"model {model!r} was undeployed while the request waited"
            for r in failed:
                self._reply_error(ticket_of(r), r.request_id, r.model, pb.ErrorCode.NOT_FOUND, why)
            self._depth_labels = {k for k in self._depth_labels if k[0] != model}
            m.forget_model(model, self._priorities)
            self._label_cache.clear()  # its series are gone: the others are resolved again
            log.info("model removed", extra={"model": model, "queued_answered": len(failed)})
        refused, again, ask = self.unloads.settle(now)  # the requests parked for a fresh read
        for p in refused:
            ticket, rid, *_ = p.args
            self._reply_error(
                ticket, rid, p.model, pb.ErrorCode.NOT_FOUND, f"model {p.model!r} is not deployed"
            )
        for p in again:
            *_, gateway, body, parts = p.args
            try:
                self._on_request(gateway, body, parts)
            except codec.ProtocolError as exc:  # verified once already; kept as _on_gateway does
                self._refuse(gateway, parts[0], exc)
        if ask:
            self.bg.submit(self._read_unloaded())

    async def _load_profile(self, model: str, device: str) -> None:
        table = await self.registry.redis.hgetall(keys.profile_key(model, device))
        if table:
            self.bg.post(lambda: self.core.profiles.get(model, device).load_us(table))


def _registered_models(reg: pb.RegisterT) -> dict[str, int]:
    """model -> max batch of a Register the codec verified (non-empty names, max_batch <= 4096)."""
    specs: Any = reg.models or ()
    return {spec.name: max(1, spec.maxBatch) for spec in specs}
