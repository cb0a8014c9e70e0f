"""Service registry in Redis with TTL heartbeats.

Each live process owns one hash `anvil:svc:{kind}:{id}` that it rewrites every heartbeat interval
with a TTL; a process that dies simply expires. Because every beat rewrites the whole hash, a Redis
restart (empty database) is survived without any special path: the next beat re-registers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from anvil_core import keys
from anvil_core.logs import get_logger
from anvil_core.redis_conn import RedisAuth, async_redis
from anvil_core.settings import redact_url

__all__ = ["Registry", "ServiceRecord", "connect_redis"]

log = get_logger("anvil.registry")

ServiceRecord = dict[str, str]


def connect_redis(url: str, auth: RedisAuth | None = None) -> aioredis.Redis:
    """An asyncio client that fails fast (1 s) so callers can fall back and retry on their own beat."""
    return async_redis(
        url,
        auth,
        decode_responses=True,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        health_check_interval=5,
    )


class Registry:
    """Owns this process's registry entry and reads everyone else's.

    The owning service calls `start()` once after its sockets are bound, `stop()` on shutdown
    (deletes the entry at once rather than waiting for the TTL). `fields` is called at every beat
    so the entry always carries live numbers (in-flight work, loaded models).
    """

    def __init__(
        self,
        redis_url: str,
        kind: str,
        service_id: str,
        ttl_s: float,
        interval_s: float,
        fields: Callable[[], Mapping[str, Any]] | None = None,
        on_beat: Callable[[aioredis.Redis], Any] | None = None,
        auth: RedisAuth | None = None,
    ) -> None:
        self.redis = connect_redis(redis_url, auth)
        self.redis_user = (auth.username if auth else None) or "default"  # shown: a name, no secret
        self.kind = kind
        self.service_id = service_id
        self._url = redact_url(redis_url)
        self._ttl_ms = int(ttl_s * 1000)
        self._interval_s = interval_s
        self._fields = fields or (lambda: {})
        self._on_beat = on_beat
        self._task: asyncio.Task[None] | None = None
        self._healthy: bool | None = None
        self.beats = 0
        self.started_at = time.time()

    @property
    def key(self) -> str:
        return keys.svc_key(self.kind, self.service_id)

    @property
    def connected(self) -> bool:
        return bool(self._healthy)

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name=f"heartbeat-{self.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            await self.redis.delete(self.key)
            await self.publish({"event": "deregistered", "kind": self.kind, "id": self.service_id})
        except RedisError:
            pass
        await self.redis.aclose()

    async def beat(self) -> bool:
        """Write the entry with a fresh TTL; returns whether Redis answered."""
        record = {k: v if isinstance(v, str) else json.dumps(v) for k, v in self._fields().items()}
        record.update(
            kind=self.kind,
            id=self.service_id,
            pid=str(os.getpid()),
            host=socket.gethostname(),
            started_at=f"{self.started_at:.3f}",
            beat_at=f"{time.time():.3f}",
            redis_user=self.redis_user,
        )
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.key, mapping=cast(Any, record))
                pipe.pexpire(self.key, self._ttl_ms)
                await pipe.execute()
            if self._on_beat is not None:
                result = self._on_beat(self.redis)
                if asyncio.iscoroutine(result):
                    await result
        except (RedisError, OSError) as exc:
            if self._healthy is not False:
                log.warning(
                    "redis unreachable; will keep retrying", extra={"redis": self._url, "err": str(exc)}
                )
            self._healthy = False
            return False
        if self._healthy is not True:
            log.info("registered", extra={"key": self.key, "redis": self._url})
            if self._healthy is None:
                await self.publish({"event": "registered", "kind": self.kind, "id": self.service_id})
        self._healthy = True
        self.beats += 1
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.beat()

    async def publish(self, event: Mapping[str, Any]) -> None:
        try:
            await self.redis.publish(keys.EVENTS, json.dumps(dict(event)))
        except (RedisError, OSError):
            pass

    async def services(self, kind: str) -> list[ServiceRecord]:
        """Every live entry of `kind` (raises RedisError when Redis is unreachable)."""
        found: list[ServiceRecord] = []
        async for key in self.redis.scan_iter(match=keys.svc_pattern(kind), count=200):
            record = await self.redis.hgetall(key)
            if record:
                found.append({_str(k): _str(v) for k, v in record.items()})
        found.sort(key=lambda r: r.get("id", ""))
        return found


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
