"""The executor process: a ZeroMQ poll loop that owns the DEALER to the scheduler, and compute
threads that run batches (STYLE rule 5: sockets belong to the I/O loop, compute reads a queue): one,
or one per lane with ``ANVIL_LANES=N`` (each runs its own instance of every compiled plan; on a GPU,
its own CUDA stream: plan_runtime/lanes.py).

A batch of a model that `prepares` (a text model: tokenization) goes first to the prep thread,
which decodes it and runs the model's host-side `prepare` while the compute thread runs the batch
before it, then queues it for compute with its rank. Other batches, and a batch that arrives with
nothing queued or running (a lone request: nothing to overlap with), are decoded and verified on
the I/O loop (once: their rank comes from that decode) and go straight to compute. Both queues serve
the most urgent batch first (work_queue.py).

The lone-batch fast path (issue #19, `_inline`): a batch that finds the executor idle, of a model
whose last batch ran within `inline_max_us`, runs on the I/O loop itself (any device): no
compute-thread wake-up, no hand-off back.

Direct requests (`_on_direct`, docs/scheduler.md): on Unix links the executor also listens on its
direct socket (peer_links.py, beside the direct answers' `deliver`), where a gateway with nothing
else in flight sends a lone request itself. It runs
when the inline rule holds (idle, a fast model), answered on that connection; otherwise it is
handed back ("busy") and the gateway sends it through the scheduler.

The compute threads hand results back over an inproc PUSH/PULL pair, so the I/O loop wakes on them
like on any other message. Redis chores (registry beat, model specs, finding the scheduler) run on
a background loop and post endpoint changes to the I/O loop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
import zmq
from redis.exceptions import RedisError

from anvil_core import codec, deployments
from anvil_core.background import Background
from anvil_core.codec import pb
from anvil_core.drops import DropLog
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_core.unix_link import UnixDealer, is_unix_endpoint, unix_path
from anvil_core.unix_peers import AnswerSender
from anvil_core.zmq_auth import PeerLog, watch_handshakes
from anvil_core.zmq_sockets import link_endpoint, make_socket
from anvil_executor import metrics as m
from anvil_executor.batch_runner import Pending, ShmResolver, account_batch, finish_batch, prepare_batch
from anvil_executor.device import is_device_fault, open_device, parse_device
from anvil_executor.loader import ModelLoader
from anvil_executor.model_loading import ModelLoading
from anvil_executor.models import Model, minilm
from anvil_executor.peer_links import DirectSocket, deliver
from anvil_executor.plan_runtime.lanes import set_lane
from anvil_executor.settings import ExecutorSettings
from anvil_executor.work_queue import LAST_RANK, BatchQueue
from anvil_kernels import set_blas_threads

__all__ = ["Executor"]

# zmq's poll flags as plain ints (an operator on the IntFlag members costs ~1 µs: enum.Flag)
_POLL_IN, _POLL_OUT = int(zmq.POLLIN), int(zmq.POLLOUT)
_POLL_INOUT = _POLL_IN | _POLL_OUT
log = get_logger("anvil.executor")


class Executor(ModelLoading):
    def __init__(self, settings: ExecutorSettings) -> None:
        self.s = settings
        self.device = parse_device(settings.device)
        self.device_info = open_device(self.device)  # DeviceError: refuse to start, never fall back
        log.info("device", extra={"device": str(self.device), "info": self.device_info})
        self.fault: BaseException | None = None  # a CUDA fault ends the process (the launcher restarts it)
        if settings.blas_threads > 0 and not set_blas_threads(settings.blas_threads):
            log.info("numpy does not use OpenBLAS here: blas_threads not applied")
        self._set_compute_threads()  # this thread loads and warms up the built-ins
        names = [n.strip() for n in settings.models.split(",") if n.strip()]
        self.bg = Background("executor-redis")
        # model -> its plan on the GPU (GPU metrics); built-ins on a GPU are registered as they load
        self._plans: dict[str, Any] = {}
        # warmed up before the registry starts: nothing is advertised cold (warmup.py)
        builtins: dict[str, Model] = {}
        for n in dict.fromkeys(minilm.SERVED_ID if n in minilm.NAMES else n for n in names):
            builtins.update(self._load(n))
        self.loader = ModelLoader(
            settings.service_id,
            str(self.device),
            builtins,
            self._reload_builtin,
            self._load_artifact,
            on_change=lambda: self.bg.post(self._register),  # the scheduler learns the served set
            retry_base_s=settings.load_retry_base_ms / 1000,
            retry_max_s=settings.load_retry_max_ms / 1000,
            served_ttl_s=settings.heartbeat_ttl_s,
        )
        self.models: dict[str, Model] = self.loader.models  # the loader swaps entries; one dict
        self.ctx = zmq.Context()
        # CURVE (issue #18): the executor's keypair, and the scheduler's key it must meet
        curve = settings.curve_client("executor")
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=settings.service_id, curve=curve)
        if curve is not None:  # a scheduler with the wrong key is logged once, not per retry
            watch_handshakes(self.sock, PeerLog(log, "executor"), "scheduler")
        # one host with ANVIL_LINK_TRANSPORT=unix: the link is a Unix stream socket (unix_link)
        unix = bool(settings.link_ipc_dir) and settings.link_transport == "unix"
        self.link: UnixDealer | None = UnixDealer(settings.service_id) if unix else None
        # direct answers (docs/scheduler.md): this host's gateways' answer sockets, beside the link
        self.answers: AnswerSender | None = None
        # direct requests (docs/scheduler.md): this executor's socket for gateways' lone requests
        self.drops = DropLog(log, "executor")
        self.direct = DirectSocket(settings.service_id, self.drops)
        # the compute threads' results (each pushes from its own socket)
        self.done_rx = make_socket(self.ctx, zmq.PULL, bind=f"inproc://done-{id(self)}")
        self.work = BatchQueue()  # most urgent batch first (work_queue.py): the compute threads'
        self.prep = BatchQueue()  # batches of models that `prepare`: the prep threads'
        self.endpoint: str | None = None
        self.inflight = 0  # batches received and not yet answered (an inline batch never counts)
        self.inline_batches = 0  # batches run on the I/O loop (`_inline`)
        self._compute_s: dict[str, float] = {}  # model -> its last batch's compute time, s
        self._beat_seq = 0
        self.shm: Any = None
        if self.device.is_cuda:  # the plans' run phases, read at each scrape
            m.register_gpu_phases(lambda: self._plans)
        self.registry = Registry(
            settings.redis_url,
            "executor",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
            on_beat=self._on_beat,
            auth=settings.redis_auth,
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "models": sorted(list(self.models)),
            "load_errors": self.loader.load_errors(),
            "max_batch": self.s.max_batch,
            "inflight": self.inflight,
            "scheduler": self.endpoint or "",
        }

    async def _on_beat(self, redis: aioredis.Redis) -> None:
        """Follow the registry's models (load, switch, unload: loader.py), advertise the served ones,
        and follow the scheduler's endpoint."""
        await self.loader.sync(redis)
        for name in [n for n in self._plans if n not in self.models]:
            self._plans.pop(name, None)  # unloaded: its GPU arena goes with its last batch
        endpoint = None
        for rec in await self.registry.services("scheduler"):
            endpoint = rec.get("executor_endpoint") or endpoint
        if endpoint:  # one host: its ipc socket instead (zmq_sockets.link_endpoint)
            endpoint = link_endpoint(self.s.link_ipc_dir, endpoint, "executor", self.s.link_transport)
        if endpoint and endpoint != self.endpoint:
            self.bg.post(lambda: self._follow(endpoint))

    # ---- I/O loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        serve_metrics(self.s.metrics_port, "executor", self.s.service_id)
        self._set_compute_threads()  # this loop runs lone batches inline (`_inline`)
        self.shm = self._shm_resolver()
        # one compute thread per lane (each runs its lane of every laned plan), as many prep threads
        lanes = range(self.s.lanes)
        computes = [threading.Thread(target=self._compute_loop, args=(i,), name=f"compute-{i}", daemon=True)
                    for i in lanes]  # fmt: skip
        preps = [threading.Thread(target=self._prep_loop, name=f"prep-{i}", daemon=True) for i in lanes]
        for t in (*computes, *preps):
            t.start()
        self.bg.submit(self.registry.start()).result(10)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.done_rx, zmq.POLLIN)
        next_beat = time.monotonic() + self.s.heartbeat_interval_s
        while not stop.is_set():
            if self.link is not None:
                if self.link.tick():  # a new connection (first, or after a loss): register on it
                    self._register()
                poller.register(self.link, _POLL_INOUT if self.link.wants_write else _POLL_IN)
            events = dict(poller.poll(50))
            if self.done_rx in events:
                self._drain_results()
            if self.sock in events:
                self._drain_scheduler()
            if self.link is not None and self.link.fileno() in events:  # zmq.Poller answers its fd
                for parts in self.link.read():
                    self._on_scheduler(parts)
                    if self.fault is not None:
                        break
            self.direct.serve(events, poller, self._on_direct, lambda: self.fault is not None)
            self.bg.drain()
            now = time.monotonic()
            if self.fault is not None:  # its batch's answer was queued before the fault was posted
                self._drain_results()
                err = str(self.fault)
                log.error("CUDA fault: exiting so the launcher restarts this executor", extra={"err": err})
                stop.set()
            if now >= next_beat:
                self._heartbeat()
                self._device_metrics()
                next_beat = now + self.s.heartbeat_interval_s
        for _ in preps:  # ranks last: what is queued there is prepared and queued for compute first
            self.prep.put(None)
        for t in preps:
            t.join(5)
        for _ in computes:
            self.work.put(None)
        for t in computes:
            t.join(5)
        self.bg.submit(self._withdraw()).result(5)
        self.bg.submit(self.registry.stop()).result(5)
        self.bg.stop()
        for sock in (self.sock, self.done_rx):
            sock.close()
        if self.link is not None:
            self.link.close()
        if self.answers is not None:
            self.answers.close()
        self.direct.close()
        self.ctx.term()
        if self.fault is not None:
            raise SystemExit(3)

    async def _withdraw(self) -> None:
        """Stopping: advertise no model (else its advertisement lives out its TTL)."""
        try:
            await deployments.withdraw_served(self.registry.redis, self.s.service_id)
        except (RedisError, OSError):
            pass  # the TTL ends it

    def _follow(self, endpoint: str) -> None:
        if self.endpoint and not is_unix_endpoint(self.endpoint):
            self.sock.disconnect(self.endpoint)
        if is_unix_endpoint(endpoint):
            if self.link is None:  # settings changed under us? never: link_endpoint follows them
                raise RuntimeError(f"a unix link endpoint without ANVIL_LINK_TRANSPORT=unix: {endpoint}")
            self.link.follow(endpoint)
            old, self.answers = (
                self.answers,
                AnswerSender(os.path.dirname(unix_path(endpoint)), self.s.service_id),
            )
            if old is not None:
                old.close()
            if self.s.direct_requests:
                self.direct.listen(os.path.dirname(unix_path(endpoint)))
        else:
            self.sock.connect(endpoint)
        self.endpoint = endpoint
        m.connected.set(1)
        log.info("connected to scheduler", extra={"endpoint": endpoint})
        self._register()

    def _on_direct(self, gateway: bytes, name: str, rid: str, request: list[bytes]) -> None:
        """One direct request of model `name` from the gateway named `gateway` (peer_links.py): run
        here, on the I/O loop, when the inline rule holds for its model (idle, fast), and answered
        on that gateway's connection; else handed back for the scheduler to carry. Its envelope is
        verified as any request's (one for another model than `name` is refused by the batch
        runner)."""
        received_ns = time.time_ns()
        if self.fault is not None or not self._runs_inline(self.models.get(name)):
            self.direct.busy(gateway, rid)
            return
        self.direct.ran += 1
        batch = pb.BatchT(
            batchId=f"direct-{self.direct.ran}",
            model=name,
            frameCounts=[len(request)],
            queueUs=[0],
            sentUnixNs=received_ns,  # no scheduler hop: the per-hop split puts the link in to_scheduler
        )
        pending = self._decode(batch, request, received_ns)
        m.direct_requests.labels(outcome="ran").inc()
        m.hop("queued", pending.priority or LAST_RANK).observe(0)
        fault = self._execute(pending, lambda _: None, direct=(gateway, rid))
        if fault is not None:
            self.fault = fault

    def _register(self) -> None:
        reg = pb.RegisterT()
        reg.kind = pb.ServiceKind.EXECUTOR
        reg.serviceId = self.s.service_id
        reg.device = str(self.device)
        reg.maxBatch = self.s.max_batch
        reg.credits = min(64, self.s.credits * self.s.lanes)  # `credits` per lane (the wire caps it at 64)
        reg.lanes = self.s.lanes  # batches at once: the scheduler keeps every lane busy
        reg.models = []
        for model in list(self.models.values()):
            spec = pb.ModelSpecT()
            spec.name = model.spec.name
            spec.version = model.spec.version
            spec.maxBatch = model.spec.max_batch
            reg.models.append(spec)
        self._send(codec.pack(reg))

    def _heartbeat(self) -> None:
        if self.endpoint is None:
            return
        self._beat_seq += 1
        hb = pb.HeartbeatT()
        hb.kind = pb.ServiceKind.EXECUTOR
        hb.serviceId = self.s.service_id
        hb.seq = self._beat_seq
        hb.inflight = self.inflight
        self._send(codec.pack(hb))

    def _send(self, parts: list[Any]) -> None:
        if self.link is not None and self.endpoint and is_unix_endpoint(self.endpoint):
            try:
                self.link.send(parts)
            except ConnectionError:  # no link right now: the scheduler re-dispatches on its side
                log.warning("scheduler unreachable; message dropped")
            return
        try:
            self.sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # no scheduler connected right now: the scheduler re-dispatches on its side
            log.warning("scheduler unreachable; message dropped")

    def _drain_scheduler(self) -> None:
        while int(self.sock.get(zmq.EVENTS)) & _POLL_IN:  # not until zmq.Again: an exception a drain
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_scheduler(parts)
            if self.fault is not None:  # a device fault: nothing more runs here (the loop exits)
                return

    def _on_scheduler(self, parts: list[Any]) -> None:
        """One message from the scheduler (either link); nothing it holds ends the loop: it is
        verified, or counted and dropped."""
        received_ns = time.time_ns()  # per-hop timing (echoed in the answers)
        try:
            body, frames = codec.unpack(parts)
            if isinstance(body, pb.ErrorT):  # the scheduler does not know us (it restarted)
                self._register()
            elif isinstance(body, pb.BatchT):
                # prepared on the prep thread only behind other work: a lone batch (nothing
                # queued or running) runs inline or goes straight to compute, thread hops fewer
                model = self.models.get(body.model or "")
                if model is not None and model.prepares and self.inflight > 0:
                    self.inflight += 1
                    m.inflight.set(self.inflight)
                    self.prep.put((body, frames, received_ns))
                    return
                # decoded and verified once, here: its rank comes from what was decoded
                pending = self._decode(body, frames, received_ns)
                rank = pending.priority or LAST_RANK
                if self._inline(pending):
                    self.inline_batches += 1
                    m.hop("queued", rank).observe(0)
                    fault = self._execute(pending, self._send)  # its answer first, then the loop exits
                    if fault is not None:
                        self.fault = fault
                    return
                self.inflight += 1
                m.inflight.set(self.inflight)
                self.work.put(pending, rank=rank, observe=True)
            else:
                raise codec.ProtocolError(f"the scheduler sent a {type(body).__name__}", "unexpected")
        except codec.ProtocolError as exc:
            self.drops.drop(exc.reason, str(exc))
        except Exception as exc:  # a bug: counted and logged with its traceback
            self.drops.drop("internal", f"{type(exc).__name__}: {exc}", exc_info=True)

    def _drain_results(self) -> None:
        while int(self.done_rx.get(zmq.EVENTS)) & _POLL_IN:
            try:
                parts = self.done_rx.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.inflight -= 1
            m.inflight.set(self.inflight)
            self._send(parts)

    # ---- compute thread -----------------------------------------------------------------------
    def _compute_loop(self, lane: int = 0) -> None:
        self._set_compute_threads()
        set_lane(lane)  # this thread runs lane `lane` of every laned plan (plan_runtime/lanes.py)
        done_tx = make_socket(self.ctx, zmq.PUSH, connect=f"inproc://done-{id(self)}")
        try:
            while (item := self.work.get()) is not None:
                if self.work.last_wait_us >= 0:  # received -> taken here (a prepared one: its prep queue's)
                    item.queued_us = self.work.last_wait_us
                fault = self._execute(item, lambda parts: done_tx.send_multipart(parts, copy=False))
                if fault is not None:  # the context is unusable: stop computing, the I/O loop exits
                    self.fault = fault
                    return
        finally:
            done_tx.close()

    def _decode(
        self, batch: pb.BatchT, frames: list[Any], received_ns: int, prepare: bool = False
    ) -> Pending:
        """A received batch decoded and verified (each bad request its own error), and with
        `prepare` also the model's `prepare` run; never raises (a bug: the batch's error)."""
        try:
            return prepare_batch(
                self.models, batch, frames, self.s.service_id, str(self.device), **self._shm_arg(),
                prepare=prepare, received_unix_ns=received_ns,
            )  # fmt: skip
        except Exception as exc:  # a bug: the batch is answered with it
            log.exception("batch preparation failed")
            failure = codec.error(pb.ErrorCode.INTERNAL, f"executor failure: {exc}")
            result = pb.BatchResultT(batchId=batch.batchId, executorId=self.s.service_id, error=failure)
            return Pending(result, None)

    def _execute(
        self,
        pending: Pending,
        send: Callable[[list[Any]], Any],
        direct: tuple[bytes, str] | None = None,
    ) -> BaseException | None:
        """Run one decoded batch and ``send`` its BatchResult's parts (after any direct answers),
        then account for it (metrics, spans: nobody waits on those); returns the device fault that
        ends the process, if one happened. Never raises: a failure is every request's answer. Called
        by the compute thread, and by the I/O loop for a lone batch of a fast model (`_inline`).
        ``direct``: a direct request's (gateway, request id): answered on that gateway's direct
        connection instead, nothing sent to the scheduler."""
        t0 = time.perf_counter() - pending.busy_s  # the compute metric keeps the decode and prepare
        name = pending.model.spec.name if pending.model else ""
        model = name if name in self.models else "_unknown"  # bounded labels
        fault: BaseException | None = None
        try:
            result, out = finish_batch(pending)
        except Exception as exc:  # never lose a batch: every request hears the failure
            log.exception("batch failed")
            fault = exc if is_device_fault(exc) else None
            failure = codec.error(pb.ErrorCode.INTERNAL, f"executor failure: {exc}")
            bid = pending.result.batchId
            result = pb.BatchResultT(batchId=bid, executorId=self.s.service_id, error=failure)
            out = []
        took_s = time.perf_counter() - t0
        if model in self.models:  # what decides whether its next lone batch runs inline: set before
            self._compute_s[model] = took_s  # the answer leaves, so the next batch sees it
        if direct is not None:
            self.direct.answer(*direct, pending, result)
        else:
            if self.answers is not None:  # the answers first: the gateways wait on them, not on metrics
                out = deliver(self.answers, pending, result, out)
            send(codec.pack(result, out))
        outcome = "error" if result.error is not None else "success"
        m.batches.labels(model=model, outcome=outcome).inc()
        m.compute_us.labels(model=model).observe(took_s * 1e6)
        account_batch(pending, result)
        return fault

    def _inline(self, pending: Pending) -> bool:
        """Whether a received batch runs here, on the I/O loop, instead of on the compute thread:
        the executor is idle (nothing queued, preparing or running: it would wait behind nothing,
        and no other thread is using the model or its device stream) and the model's last batch ran
        within `inline_max_us` (the loop is blocked while it runs: heartbeats and receiving wait,
        bounded by that). Any device: a GPU model's stream and graphs are used by one thread at a
        time either way. A model that `prepares` runs its `prepare` inline too (nothing is behind it
        to overlap with). Saves the compute thread's wake-up and the result's hand-off back (issue
        #19: two thread switches per lone batch)."""
        return self._runs_inline(pending.model)

    def _runs_inline(self, model: Model | None) -> bool:
        if self.inflight or self.s.inline_max_us <= 0 or model is None:
            return False
        took_s = self._compute_s.get(model.spec.name)
        return took_s is not None and took_s * 1e6 <= self.s.inline_max_us

    def _shm_arg(self) -> dict[str, Any]:
        return {"shm": self.shm} if self.shm is not None else {}

    def _prep_loop(self) -> None:
        """Decode, verify and `prepare` the batches of models that prepare, most urgent first, then
        queue each for compute with its rank. Nothing here touches a device; a failure becomes the
        batch's error result, which the compute thread sends in its turn."""
        while (item := self.prep.get()) is not None:
            batch, frames, received_ns = item
            pending = self._decode(batch, frames, received_ns, prepare=True)
            pending.queued_us = self.prep.last_wait_us
            self.work.put(pending, rank=pending.priority or LAST_RANK)

    def _shm_resolver(self) -> ShmResolver | None:
        if not self.s.shm_inputs:
            return None
        try:
            from anvil_executor.shm_inputs import ShmInputs
        except ImportError:
            return None
        shm = ShmInputs(self.s.redis_url, auth=self.s.redis_auth)
        start = getattr(shm, "start", None)
        if callable(start):
            start()
        resolver: ShmResolver = shm.resolve
        return resolver
