"""Triton statistics of every gateway process, for the stats routes (and any other front end).

Each gateway process counts what it served (stats.py) and publishes its entries at every heartbeat
(`anvil:gwstats:<service id>`, JSON, with the registry entry's TTL). `stats_doc` answers with this
process's live counts plus the other live gateways' last published ones, so a client asking any
worker (ANVIL_HTTP_WORKERS > 1) or any gateway gets the totals. Limits: another process's share is up
to one heartbeat old (ANVIL_HEARTBEAT_INTERVAL_MS); a gateway that stopped takes its counts with it
(its key expires), as a restarted Triton starts from zero; without Redis, this process's share.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from anvil_core import keys
from anvil_core.logs import get_logger
from anvil_gateway.state import GatewayState
from anvil_gateway.stats import Stats, add_peer

__all__ = ["model_stats", "publish", "stats_doc"]

log = get_logger("anvil.gateway.stats")
_MAX_PEER_BYTES = 4 << 20  # one gateway's share: thousands of model versions' worth; larger is refused


async def publish(redis: aioredis.Redis, stats: Stats, service_id: str, ttl_s: float) -> None:
    """Write this process's share (the registry's heartbeat calls it; Redis errors are its to log)."""
    await redis.set(keys.gateway_stats_key(service_id), json.dumps(stats.snapshot()), px=int(ttl_s * 1000))


async def _peers(st: GatewayState) -> list[Any]:
    """The other live gateways' shares (each a list of model entries), as they published them."""
    mine = keys.gateway_stats_key(st.settings.service_id)
    out = []
    try:
        redis = st.registry.redis
        async for key in redis.scan_iter(match=keys.gateway_stats_pattern(), count=200):
            name = key.decode() if isinstance(key, bytes) else key
            raw = None if name == mine else await redis.get(key)
            if not raw or len(raw) > _MAX_PEER_BYTES:
                continue
            try:
                entries = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entries, list):
                out.append(entries)
    except (RedisError, OSError) as exc:
        log.warning("statistics of the other gateways unavailable", extra={"err": str(exc)})
    return out


async def stats_doc(st: GatewayState, models: list[tuple[str, str]]) -> dict[str, Any]:
    """Triton's `model_stats` document for these (model, version)s, summed over every gateway."""
    docs = copy.deepcopy(st.stats.doc(models)["model_stats"])
    if not docs:
        return {"model_stats": []}
    wanted: dict[tuple[Any, Any], dict[str, Any]] = {(d["name"], d["version"]): d for d in docs}
    for entries in await _peers(st):
        for entry in entries:
            doc = wanted.get((entry.get("name"), entry.get("version"))) if isinstance(entry, dict) else None
            if doc is not None and not add_peer(doc, entry):
                log.warning("a gateway published malformed statistics", extra={"model": doc["name"]})
    return {"model_stats": docs}


async def model_stats(st: GatewayState, name: str, version: str) -> dict[str, Any]:
    """One model version's Triton statistics entry, summed over every gateway."""
    (doc,) = (await stats_doc(st, [(name, version)]))["model_stats"]
    return doc  # type: ignore[no-any-return]
