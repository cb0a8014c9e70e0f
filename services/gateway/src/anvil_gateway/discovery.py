"""What the gateway knows from the registry: the scheduler to talk to and the models' specs.

A background task refreshes a snapshot, so the request path never waits on Redis and keeps working
through a Redis restart. Readiness is asked of Redis directly (exact, not cached). A model is
served once an executor advertises it (READY, ``anvil_core.deployments``), with the spec that
executor serves; a model marked unloaded (`anvil undeploy`, the repository API's unload) leaves the
snapshot at the next refresh: requests for it are answered 404 from then on. The gateway reads the
deployments; the only deployment key it writes is the unload mark (repository.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from anvil_core import deployments, keys
from anvil_core.logs import get_logger
from anvil_core.model_spec import ModelSpec
from anvil_core.registry import Registry

__all__ = ["Discovery"]

MAX_MODEL_NAME = 256  # bytes; the wire's limit on a model name
MISS_CACHE = 1024  # unknown names remembered between registry reads

log = get_logger("anvil.gateway.discovery")


class Discovery:
    def __init__(
        self,
        registry: Registry,
        interval_s: float,
        on_scheduler: Callable[[str], None],
        on_limits: Callable[[dict[str, str], dict[str, str]], None] | None = None,
    ) -> None:
        self.registry = registry
        self.on_limits = on_limits
        self.interval_s = interval_s
        self.on_scheduler = on_scheduler
        self.scheduler_endpoint: str | None = None
        self.models: dict[str, ModelSpec] = {}
        self._seen_at: dict[str, float] = {}  # model -> monotonic time its spec was last read
        # A model missing from Redis for less than this is kept: after a Redis restart the specs
        # come back with the executors' next beats, and requests must not 404 meanwhile.
        self.forget_after_s = 10.0
        self._task: asyncio.Task[None] | None = None
        self._misses: dict[str, float] = {}  # name -> monotonic time the registry last lacked it

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()

    async def refresh(self) -> None:
        try:
            schedulers = await self.registry.services("scheduler")
            models = await self._load_models()
            if self.on_limits is not None:
                limits = await self.registry.redis.hgetall(keys.qos_limits_key())
                tenants = await self.registry.redis.hgetall(keys.tenants_key())
                self.on_limits(_strs(limits), _strs(tenants))
        except (RedisError, OSError):
            return  # keep the last snapshot; the registry logs the outage once
        now = time.monotonic()
        for name in models:
            self._seen_at[name] = now
        kept = {
            n: spec
            for n, spec in self.models.items()
            if n not in models and now - self._seen_at.get(n, now) < self.forget_after_s
        }
        self.models = {**kept, **models}
        endpoint = schedulers[0].get("gateway_endpoint") if schedulers else None
        if endpoint and endpoint != self.scheduler_endpoint:
            self.scheduler_endpoint = endpoint
            log.info("scheduler found", extra={"endpoint": endpoint})
            self.on_scheduler(endpoint)

    async def _load_models(self) -> dict[str, ModelSpec]:
        out: dict[str, ModelSpec] = {}
        for name, dep in (await deployments.snapshot(self.registry.redis, with_versions=False)).items():
            if dep.status == deployments.UNLOADED:  # undeployed or unloaded: forgotten now (404), not kept
                self._seen_at.pop(name, None)
                self.models.pop(name, None)
                continue
            if dep.status != deployments.READY:  # deployed, not yet served: keep what is served meanwhile
                if name in self.models:
                    out[name] = self.models[name]
                continue
            spec = _spec(dep.spec)
            if spec is not None:
                out[spec.name] = spec
        return out

    async def learn(self, model: str) -> bool:
        """Whether ``model``, missing from the snapshot, is served now (read from the registry at once).

        A request sent right after `anvil deploy --wait` returned READY would otherwise meet the
        snapshot of up to one refresh interval ago and get 404. A name the registry lacks is asked
        again at most once per interval, and at most MISS_CACHE names are remembered, so random
        names from clients cost a bounded number of Redis reads and no unbounded memory."""
        if not model or len(model) > MAX_MODEL_NAME:
            return False
        now = time.monotonic()
        last = self._misses.get(model)
        if last is not None and now - last < self.interval_s:
            return False
        if await self._served_spec(model):
            self._misses.pop(model, None)
            return True
        if len(self._misses) >= MISS_CACHE:
            self._misses.clear()
        self._misses[model] = now
        return False

    async def _served_spec(self, model: str) -> bool:
        """Whether an executor advertises ``model`` (READY, with the spec it serves; `anvil deploy`
        writes the plan's spec). Takes that spec into the snapshot at once, so a request right after
        "ready" is checked against what the executor serves (a deployed encoder serves text, not the
        token ids of its plan), not the spec of the last refresh."""
        try:
            dep = await deployments.read(self.registry.redis, model, with_versions=False)
        except (RedisError, OSError):
            return model in self.models
        if dep is not None and dep.status == deployments.UNLOADED:
            self.models.pop(model, None)
            return False
        if dep is None or dep.status != deployments.READY:
            return model in self.models  # a new version is loading; the served one still answers
        spec = _spec(dep.spec)
        if spec is None:
            return False
        self.models[model] = spec
        return True

    async def ready(self, model: str | None = None) -> tuple[bool, str]:
        """(ready, why-not): an executor (serving `model`, if given) is registered in Redis AND a
        scheduler reports it connected — both, so that readiness never runs ahead of dispatch."""
        try:
            schedulers = await self.registry.services("scheduler")
            executors = await self.registry.services("executor")
        except (RedisError, OSError):
            return False, "registry (redis) unreachable"
        if not schedulers:
            return False, "no scheduler registered"
        served = {m for rec in schedulers for m in _json_list(rec.get("served", "[]"))}
        if model is not None:
            executors = [e for e in executors if model in _json_list(e.get("models", "[]"))]
            if not executors:
                return False, f"no executor serving model {model!r}"
            if model not in served:
                return False, f"no executor serving model {model!r} is connected to a scheduler yet"
            if not await self._served_spec(model):
                return False, f"model {model!r} is not yet published by an executor that serves it"
        elif not executors:
            return False, "no executor registered"
        elif not served:
            return False, "no executor is connected to a scheduler yet"
        else:  # every model the scheduler can dispatch must be routable here, not one refresh later
            unknown = [m for m in sorted(served) if m not in self.models and not await self._served_spec(m)]
            if unknown:
                return False, f"models served but not yet published: {unknown}"
        return True, ""


def _spec(raw: str) -> ModelSpec | None:
    try:
        return ModelSpec.from_json(raw)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _json_list(raw: str) -> list[str]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _strs(raw: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in raw.items()
    }
