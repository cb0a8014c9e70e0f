"""What the gateway takes from the registry about models: only what an executor advertises (READY),
with the spec that executor serves; a deployment record alone (COMPILED, the plan's spec) is not
served yet."""

from __future__ import annotations

import asyncio
import json

import redis

from anvil_core import keys
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.registry import Registry
from anvil_gateway.discovery import Discovery

PLAN = ModelSpec(
    "enc", inputs=(TensorSpec("input_ids", "INT64", (-1,)),), outputs=(TensorSpec("e", "FP32", (4,)),)
)
TEXT = ModelSpec(
    "enc", inputs=(TensorSpec("TEXT", "BYTES", ()),), outputs=(TensorSpec("EMBEDDING", "FP32", (4,)),)
)
SERVED = keys.served_key("e1")  # executor e1's advertisement


def _deploy(r: redis.Redis, artifact: str) -> None:
    """`anvil deploy`'s record: the plan's spec, COMPILED."""
    r.hset(
        keys.model_key("enc"), mapping={"spec": PLAN.to_json(), "status": "COMPILED", "artifact": artifact}
    )


def _advertise(r: redis.Redis, artifact: str) -> None:
    """Executor e1's beat once it serves `artifact`, warm: the spec it serves."""
    r.hset(SERVED, "enc", json.dumps({"artifact": artifact, "version": "1", "spec": TEXT.to_json()}))


def test_a_deployed_model_is_known_once_an_executor_serves_it_and_stays_known_while_it_reloads(
    redis_server: str,
) -> None:
    r = redis.Redis.from_url(redis_server)
    key = keys.model_key("enc")

    async def run() -> None:
        d = Discovery(Registry(redis_server, "gateway", "g1", 3.0, 1.0), 0.25, lambda _: None)
        try:
            _deploy(r, "a1")  # `anvil deploy`
            await d.refresh()
            assert "enc" not in d.models  # compiled is not served: no spec of token ids to check against
            assert not await d._served_spec("enc")
            _advertise(r, "a1")  # the executor, warm
            assert await d._served_spec("enc") and d.models["enc"] == TEXT  # taken at once by "ready"
            _deploy(r, "a2")  # a new version deployed
            await d.refresh()
            assert d.models["enc"] == TEXT and await d._served_spec("enc")  # the old one still answers
            r.hset(keys.model_unloaded_key("enc"), "reason", "unloaded")  # the repository API's unload
            await d.refresh()
            assert "enc" not in d.models and not await d._served_spec("enc")
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key, SERVED, keys.model_unloaded_key("enc"))
        r.close()


def test_the_gateway_is_ready_only_once_it_can_route_every_model_the_scheduler_serves(
    redis_server: str,
) -> None:
    """Readiness with no model named includes the snapshot: a stack that reports ready must not answer
    its first requests "unknown model" while the next refresh is still to come (seen in CI)."""
    r = redis.Redis.from_url(redis_server)
    svc = [keys.svc_key("scheduler", "s1"), keys.svc_key("executor", "e1")]
    key = keys.model_key("enc")
    r.hset(svc[0], mapping={"id": "s1", "served": '["enc"]'})
    r.hset(svc[1], mapping={"id": "e1", "models": '["enc"]'})

    async def run() -> None:
        d = Discovery(Registry(redis_server, "gateway", "g1", 3.0, 1.0), 0.25, lambda _: None)
        try:
            _deploy(r, "a1")
            ok, why = await d.ready()
            assert not ok and "not yet published" in why and "enc" not in d.models
            _advertise(r, "a1")
            assert await d.ready() == (True, "") and d.models["enc"] == TEXT  # no refresh ran
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key, SERVED, *svc)
        r.close()


def test_a_model_served_since_the_last_refresh_is_learned_at_its_first_request(redis_server: str) -> None:
    """`anvil deploy --wait` returns once the executor wrote READY; the next request must not meet the
    snapshot of the last refresh (404 'unknown model', seen in CI). Unknown names are asked at most
    once per interval."""
    r = redis.Redis.from_url(redis_server)
    key = keys.model_key("enc")

    async def run() -> None:
        d = Discovery(Registry(redis_server, "gateway", "g1", 3.0, 1.0), 60.0, lambda _: None)
        reads = 0
        served = d._served_spec

        async def counted(model: str) -> bool:
            nonlocal reads
            reads += 1
            return await served(model)

        d._served_spec = counted  # type: ignore[method-assign]
        try:
            await d.refresh()
            assert "enc" not in d.models
            assert not await d.learn("enc") and reads == 1
            _advertise(r, "")  # a built-in: no deployment record
            assert not await d.learn("enc") and reads == 1  # asked a moment ago: not again this interval
            d._misses.clear()  # the interval has passed
            assert await d.learn("enc") and d.models["enc"] == TEXT and reads == 2
            assert not await d.learn("x" * 300) and reads == 2  # not a model name: no registry read
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key, SERVED, keys.model_unloaded_key("enc"))
        r.close()
