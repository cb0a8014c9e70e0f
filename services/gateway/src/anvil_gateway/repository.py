"""The KServe model repository extension over the registry's deploy/undeploy (anvil_core.deployments),
for both front ends: routes_meta.py (HTTP) and grpc_meta.py (gRPC) call these and nothing else.
Failures are `Failed` with the HTTP status (404 unknown model, 503 registry unreachable or a load
that does not serve in time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from anvil_core import deployments
from anvil_gateway.request_path import Failed
from anvil_gateway.state import GatewayState

__all__ = ["index", "load", "unload"]


async def index(st: GatewayState) -> list[dict[str, str]]:
    """Every model and version the registry knows with its true state: READY (served), LOADING
    (deployed, no executor serves it yet), UNAVAILABLE (unloaded, or not the served version)."""
    try:
        return await deployments.index(st.registry.redis)
    except (RedisError, OSError) as exc:
        raise Failed(503, f"registry (redis) unreachable: {exc}", "unavailable") from None


async def load(st: GatewayState, name: str) -> str:
    """Serve the model's newest deployed version again (after an unload); the executors that place
    it load it and warm it up. Returns, like Triton, once it serves, or raises Failed(503) after
    ``repository_load_wait_ms`` saying why it does not serve yet."""
    done = await _change(st, name, deployments.load)
    deadline = time.monotonic() + st.settings.repository_load_wait_ms / 1000
    while True:
        ok, why = await st.discovery.ready(name)
        if ok:
            await st.discovery.refresh()
            return done
        if time.monotonic() >= deadline:
            raise Failed(503, f"model {name!r} does not serve yet: {why}", "unavailable")
        await asyncio.sleep(0.1)


async def unload(st: GatewayState, name: str) -> str:
    """Stop serving the model (its deployed versions stay in the repository for a later load):
    executors unload it, requests queued for it are answered with an error, new ones get 404."""
    return await _change(st, name, deployments.unload)


async def _change(st: GatewayState, name: str, change: Callable[[Any, str], Awaitable[str]]) -> str:
    try:
        done = await change(st.registry.redis, name)
    except deployments.RepositoryError as exc:
        raise Failed(404, str(exc), "not_found") from None
    except (RedisError, OSError) as exc:
        raise Failed(503, f"registry (redis) unreachable: {exc}", "unavailable") from None
    await st.discovery.refresh()  # unload: 404 from this gateway at once
    return done
