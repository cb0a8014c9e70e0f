"""The executor process: a ZeroMQ poll loop that owns the DEALER to the scheduler, and one compute
thread that runs batches (STYLE rule 5: sockets belong to the I/O loop, compute reads a queue).

The compute thread hands results back over an inproc PAIR socket, so the I/O loop wakes on them
like on any other message. Redis chores (registry beat, model specs, finding the scheduler) run on
a background loop and post endpoint changes to the I/O loop.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import zmq

from anvil_core import keys, wire
from anvil_core.background import Background
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_core.wire import pb
from anvil_executor import metrics as m
from anvil_executor.batch_runner import ShmResolver, run_batch
from anvil_executor.device import is_device_fault, open_device, parse_device
from anvil_executor.models import Model, load_builtin
from anvil_executor.models.builtin import BusyModel
from anvil_executor.settings import ExecutorSettings
from anvil_executor.warmup import warm_up
from anvil_executor.work_queue import BatchQueue
from anvil_kernels import set_blas_threads

__all__ = ["Executor"]

log = get_logger("anvil.executor")


class Executor:
    def __init__(self, settings: ExecutorSettings) -> None:
        self.s = settings
        self.device = parse_device(settings.device)
        self.device_info = open_device(self.device)  # DeviceError: refuse to start, never fall back
        log.info("device", extra={"device": str(self.device), "info": self.device_info})
        self.fault: BaseException | None = None  # a CUDA fault ends the process (the launcher restarts it)
        if settings.blas_threads > 0 and not set_blas_threads(settings.blas_threads):
            log.info("numpy does not use OpenBLAS here: blas_threads not applied")
        names = [n.strip() for n in settings.models.split(",") if n.strip()]
        # warmed up before the registry starts: nothing is advertised cold (warmup.py)
        self.models: dict[str, Model] = {n: self._warm(self._load(n)) for n in names}
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, settings.service_id.encode())
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.done_rx = self.ctx.socket(zmq.PAIR)
        self.done_rx.bind(f"inproc://done-{id(self)}")
        self.work = BatchQueue()  # most urgent batch first (work_queue.py)
        self.endpoint: str | None = None
        self.inflight = 0
        self._beat_seq = 0
        self.shm: Any = None
        self._artifacts: dict[str, str] = {}  # model -> artifact id loaded
        self._plans: dict[str, Any] = {}  # model -> its GpuPlanModel (GPU metrics)
        self._loading: set[str] = set()
        self.bg = Background("executor-redis")
        self.registry = Registry(
            settings.redis_url,
            "executor",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
            on_beat=self._on_beat,
        )

    def _load(self, name: str) -> Model:
        if name == "busy":
            return BusyModel(self.s.max_batch, self.s.busy_base_us, self.s.busy_per_row_us)
        return load_builtin(name, self.s.max_batch)

    def _warm(self, model: Model) -> Model:
        warm_up(model, self.s.max_batch)
        return model

    def _fields(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "models": sorted(self.models),
            "max_batch": self.s.max_batch,
            "inflight": self.inflight,
            "scheduler": self.endpoint or "",
        }

    async def _on_beat(self, redis: aioredis.Redis) -> None:
        """Load newly deployed artifacts, publish model specs and follow the scheduler's endpoint."""
        async for key in redis.scan_iter(match=keys.model_key("*")):
            raw = await redis.hget(key, "artifact")
            art = raw.decode() if isinstance(raw, bytes) else (raw or "")
            name = (key.decode() if isinstance(key, bytes) else key).removeprefix(keys.model_key(""))
            if art and self._artifacts.get(name) != art and name not in self._loading:
                self._loading.add(name)
                threading.Thread(target=self._load_plan, args=(name, art), daemon=True).start()
        async with redis.pipeline(transaction=False) as pipe:
            for name, model in self.models.items():
                pipe.hset(keys.model_key(name), mapping={"spec": model.spec.to_json(), "status": "READY"})
            await pipe.execute()
        endpoint = None
        for rec in await self.registry.services("scheduler"):
            endpoint = rec.get("executor_endpoint") or endpoint
        if endpoint and endpoint != self.endpoint:
            self.bg.post(lambda: self._follow(endpoint))

    def _load_plan(self, name: str, artifact: str) -> None:
        """Loader thread (numba warm-up is slow): the model joins the served set when ready."""
        from anvil_executor.artifact import load_artifact

        try:
            gpu = {"gemm": self.s.gpu_gemm, "tf32": self.s.gpu_tf32}
            model, plan = load_artifact(Path(self.s.artifact_dir) / artifact, self.device, name, gpu)
            self._warm(model)  # before the steady-state mark: its first runs may touch memory
            if self.device.is_cuda:
                self._gpu_loaded(name, plan)
                self._plans[name] = plan
            self.models[name] = model  # advertised (READY) only once warm
            self._artifacts[name] = artifact
            self.bg.post(self._register)  # tell the scheduler about the new model
            where = {"model": name, "artifact": artifact, "platform": model.spec.platform}
            log.info("artifact loaded", extra=where)
        except Exception:
            log.exception("cannot load artifact", extra={"model": name, "artifact": artifact})
        finally:
            self._loading.discard(name)

    def _gpu_loaded(self, name: str, plan: Any) -> None:
        from anvil_executor.plan_runtime.cuda_arena import counter

        m.graphs.labels(model=name).set(plan.graph_count)
        for bank, size in plan.arena.usage().items():
            m.device_bytes.labels(model=name, bank=bank).set(size)
        plan.padded_cells = plan.used_cells = 0  # padding is reported for served batches, not warm-up
        counter.mark_steady()  # loads are done: what follows must allocate nothing

    def _device_metrics(self) -> None:
        if not self.device.is_cuda:
            return
        from anvil_executor.plan_runtime.cuda_arena import counter

        m.device_allocations.set(counter.steady_allocations)
        m.module_loads.set(counter.steady_module_loads)
        for name, plan in list(self._plans.items()):
            m.padding_waste.labels(model=name).set(plan.padding_waste)

    # ---- I/O loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        serve_metrics(self.s.metrics_port, "executor", self.s.service_id)
        self.shm = self._shm_resolver()
        compute = threading.Thread(target=self._compute_loop, name="compute", daemon=True)
        compute.start()
        self.bg.submit(self.registry.start()).result(10)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.done_rx, zmq.POLLIN)
        next_beat = time.monotonic() + self.s.heartbeat_interval_s
        while not stop.is_set():
            events = dict(poller.poll(50))
            if self.done_rx in events:
                self._drain_results()
            if self.sock in events:
                self._drain_scheduler()
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
        self.work.put(None)
        compute.join(5)
        self.bg.submit(self.registry.stop()).result(5)
        self.bg.stop()
        for sock in (self.sock, self.done_rx):
            sock.close()
        self.ctx.term()
        if self.fault is not None:
            raise SystemExit(3)

    def _follow(self, endpoint: str) -> None:
        if self.endpoint:
            self.sock.disconnect(self.endpoint)
        self.sock.connect(endpoint)
        self.endpoint = endpoint
        m.connected.set(1)
        log.info("connected to scheduler", extra={"endpoint": endpoint})
        self._register()

    def _register(self) -> None:
        reg = pb.RegisterT()
        reg.kind = pb.ServiceKind.EXECUTOR
        reg.serviceId = self.s.service_id
        reg.device = str(self.device)
        reg.maxBatch = self.s.max_batch
        reg.credits = self.s.credits
        reg.models = []
        for model in self.models.values():
            spec = pb.ModelSpecT()
            spec.name = model.spec.name
            spec.version = model.spec.version
            spec.maxBatch = model.spec.max_batch
            reg.models.append(spec)
        self._send(wire.pack(reg))

    def _heartbeat(self) -> None:
        if self.endpoint is None:
            return
        self._beat_seq += 1
        hb = pb.HeartbeatT()
        hb.kind = pb.ServiceKind.EXECUTOR
        hb.serviceId = self.s.service_id
        hb.seq = self._beat_seq
        hb.inflight = self.inflight
        self._send(wire.pack(hb))

    def _send(self, parts: list[Any]) -> None:
        try:
            self.sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # no scheduler connected right now: the scheduler re-dispatches on its side
            log.warning("scheduler unreachable; message dropped")

    def _drain_scheduler(self) -> None:
        while True:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                body, frames = wire.unpack(parts)
            except wire.ProtocolError as exc:
                log.warning("undecodable message from the scheduler", extra={"err": str(exc)})
                continue
            if isinstance(body, pb.ErrorT):  # the scheduler does not know us (it restarted)
                self._register()
            elif isinstance(body, pb.BatchT):
                self.inflight += 1
                m.inflight.set(self.inflight)
                self.work.put((body, frames))

    def _drain_results(self) -> None:
        while True:
            try:
                parts = self.done_rx.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.inflight -= 1
            m.inflight.set(self.inflight)
            self._send(parts)

    # ---- compute thread -----------------------------------------------------------------------
    def _compute_loop(self) -> None:
        done_tx = self.ctx.socket(zmq.PAIR)
        done_tx.connect(f"inproc://done-{id(self)}")
        try:
            while (item := self.work.get()) is not None:
                batch, frames = item
                t0 = time.perf_counter()
                model = wire.text(batch.model)
                fault: BaseException | None = None
                try:
                    result, out = run_batch(
                        self.models,
                        batch,
                        frames,
                        self.s.service_id,
                        str(self.device),
                        **({"shm": self.shm} if self.shm is not None else {}),
                    )
                except Exception as exc:  # never lose a batch: every request hears the failure
                    log.exception("batch failed")
                    fault = exc if is_device_fault(exc) else None
                    result, out = pb.BatchResultT(), []
                    result.batchId = batch.batchId
                    result.executorId = self.s.service_id
                    result.error = wire.error(pb.ErrorCode.INTERNAL, f"executor failure: {exc}")
                outcome = "error" if result.error is not None else "success"
                m.batches.labels(model=model, outcome=outcome).inc()
                m.compute_us.labels(model=model).observe((time.perf_counter() - t0) * 1e6)
                done_tx.send_multipart(wire.pack(result, out), copy=False)
                if fault is not None:  # the context is unusable: stop computing, the I/O loop exits
                    self.fault = fault
                    return
        finally:
            done_tx.close()

    def _shm_resolver(self) -> ShmResolver | None:
        if not self.s.shm_inputs:
            return None
        try:
            from anvil_executor.shm_inputs import ShmInputs
        except ImportError:
            return None
        shm = ShmInputs(self.s.redis_url)
        start = getattr(shm, "start", None)
        if callable(start):
            start()
        resolver: ShmResolver = shm.resolve
        return resolver
