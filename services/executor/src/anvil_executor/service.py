"""The executor process: a DEALER to the scheduler (found through Redis) and one compute thread.

The asyncio task owns the socket; batches go to a single worker thread and come back as results,
so heartbeats keep flowing while a long batch runs.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aioredis
import zmq
import zmq.asyncio
from anvil_core import keys, wire
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_core.wire import pb
from anvil_core.zmq_sockets import make_socket

from anvil_executor import metrics as m
from anvil_executor.batch_runner import run_batch
from anvil_executor.models import Model, load_builtin
from anvil_executor.settings import ExecutorSettings

__all__ = ["Executor"]

log = get_logger("anvil.executor")


class Executor:
    def __init__(self, settings: ExecutorSettings) -> None:
        self.s = settings
        names = [n.strip() for n in settings.models.split(",") if n.strip()]
        self.models: dict[str, Model] = {n: load_builtin(n, settings.max_batch) for n in names}
        self.ctx = zmq.asyncio.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=settings.service_id)
        self.endpoint: str | None = None
        self.inflight = 0
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._beat_seq = 0
        self.registry = Registry(
            settings.redis_url,
            "executor",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
            on_beat=self._on_beat,
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "device": self.s.device,
            "models": sorted(self.models),
            "max_batch": self.s.max_batch,
            "inflight": self.inflight,
            "scheduler": self.endpoint or "",
        }

    async def _on_beat(self, redis: aioredis.Redis) -> None:
        """Publish model specs and follow the scheduler's endpoint (it may move after a restart)."""
        async with redis.pipeline(transaction=False) as pipe:
            for name, model in self.models.items():
                pipe.hset(keys.model_key(name), mapping={"spec": model.spec.to_json(), "status": "READY"})
            await pipe.execute()
        endpoint = None
        for rec in await self.registry.services("scheduler"):
            endpoint = rec.get("executor_endpoint") or endpoint
        if endpoint and endpoint != self.endpoint:
            if self.endpoint:
                self.sock.disconnect(self.endpoint)
            self.sock.connect(endpoint)
            self.endpoint = endpoint
            m.connected.set(1)
            log.info("connected to scheduler", extra={"endpoint": endpoint})
            await self._register()

    async def _register(self) -> None:
        reg = pb.RegisterT()
        reg.kind = pb.ServiceKind.EXECUTOR
        reg.serviceId = self.s.service_id
        reg.device = self.s.device
        reg.maxBatch = self.s.max_batch
        reg.credits = self.s.credits
        reg.models = []
        for model in self.models.values():
            spec = pb.ModelSpecT()
            spec.name = model.spec.name
            spec.version = model.spec.version
            spec.maxBatch = model.spec.max_batch
            reg.models.append(spec)
        await self.sock.send_multipart(wire.pack(reg))

    async def run(self, stop: asyncio.Event) -> None:
        serve_metrics(self.s.metrics_port, "executor", self.s.service_id)
        await self.registry.start()
        tasks = [
            asyncio.create_task(self._rx_loop(), name="rx"),
            asyncio.create_task(self._heartbeat_loop(), name="zmq-heartbeat"),
        ]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.registry.stop()
        self._compute.shutdown(wait=False, cancel_futures=True)
        self.sock.close()
        self.ctx.term()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.s.heartbeat_interval_s)
            if self.endpoint is None:
                continue
            self._beat_seq += 1
            hb = pb.HeartbeatT()
            hb.kind = pb.ServiceKind.EXECUTOR
            hb.serviceId = self.s.service_id
            hb.seq = self._beat_seq
            hb.inflight = self.inflight
            await self.sock.send_multipart(wire.pack(hb))

    async def _rx_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            parts = await self.sock.recv_multipart(copy=False)
            try:
                body, frames = wire.unpack(parts)
            except wire.ProtocolError as exc:
                log.warning("undecodable message from the scheduler", extra={"err": str(exc)})
                continue
            if isinstance(body, pb.ErrorT):  # the scheduler does not know us (it restarted)
                await self._register()
            elif isinstance(body, pb.BatchT):
                self.inflight += 1
                m.inflight.set(self.inflight)
                fut = loop.run_in_executor(
                    self._compute, run_batch, self.models, body, frames, self.s.service_id, self.s.device
                )
                fut.add_done_callback(functools.partial(self._on_done, batch=body, t0=time.perf_counter()))

    def _on_done(
        self, fut: asyncio.Future[tuple[pb.BatchResultT, list[Any]]], batch: pb.BatchT, t0: float
    ) -> None:
        self.inflight -= 1
        m.inflight.set(self.inflight)
        model = wire.text(batch.model)
        try:
            result, frames = fut.result()
        except Exception as exc:
            result = pb.BatchResultT()
            result.batchId = batch.batchId
            result.executorId = self.s.service_id
            result.error = wire.error(pb.ErrorCode.INTERNAL, f"executor failure: {exc}")
            frames = []
        outcome = "error" if result.error is not None else "success"
        m.batches.labels(model=model, outcome=outcome).inc()
        m.compute_us.labels(model=model).observe((time.perf_counter() - t0) * 1e6)
        asyncio.get_running_loop().create_task(self._send(wire.pack(result, frames)))

    async def _send(self, parts: list[Any]) -> None:
        await self.sock.send_multipart(parts, copy=False)
