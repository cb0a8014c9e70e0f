"""What the scheduler publishes to Redis every `publish_interval_ms` (its SLO attainment per
priority, for `anvil status` and the gateways' admission; its learned latency profiles, which a
restarted scheduler loads back): taken on the scheduler's thread, written from its background loop."""

from __future__ import annotations

import json
import time
from typing import Any

from anvil_core import keys
from anvil_scheduler import metrics as m
from anvil_scheduler.core import SchedulerCore

__all__ = ["EMPTY", "publish", "take"]

EMPTY: dict[str, Any] = {"profiles": {}, "slo": {}}


def take(core: SchedulerCore, now: float) -> dict[str, Any]:
    """The snapshot of `core` at `now` (and the SLO attainment gauges set from it)."""
    slo = {p: a for p, a in core.slo.attainment_all(now).items() if a is not None}
    for p, a in slo.items():
        m.slo_attainment.labels(priority=str(p)).set(a)
    return {
        "slo": {
            str(p): json.dumps(
                {
                    "attainment": a,
                    "requests": core.slo.count(p, now),
                    "p99_ms": None if (p99 := core.slo.p99_s(p, now)) is None else p99 * 1000,
                    "slo_ms": core.config.priority(p).slo_ms,
                    "window_s": core.config.slo_window_s,
                    "ts": time.time(),
                }
            )
            for p, a in slo.items()
        },
        "profiles": {
            keys.profile_key(model, spec.device): core.profiles.get(model, spec.device).export_us()
            for spec in core.pool.specs()
            for model in spec.models
        },
    }


async def publish(redis: Any, snap: dict[str, Any]) -> None:
    """Write a snapshot in one pipeline round trip."""
    async with redis.pipeline(transaction=False) as pipe:
        if snap["slo"]:
            pipe.hset(keys.slo_key(), mapping=snap["slo"])
        for key, table in snap["profiles"].items():
            if table:
                pipe.hset(key, mapping={str(k): str(v) for k, v in table.items()})
        await pipe.execute()
