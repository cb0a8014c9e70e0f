"""What the gateway takes from the registry about models: only what an executor publishes (READY)."""

from __future__ import annotations

import asyncio

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


def test_a_deployed_model_is_known_once_an_executor_serves_it_and_stays_known_while_it_reloads(
    redis_server: str,
) -> None:
    r = redis.Redis.from_url(redis_server)
    key = keys.model_key("enc")

    async def run() -> None:
        d = Discovery(Registry(redis_server, "gateway", "g1", 3.0, 1.0), 0.25, lambda _: None)
        try:
            r.hset(key, mapping={"spec": PLAN.to_json(), "status": "COMPILED"})  # `anvil deploy`
            await d.refresh()
            assert "enc" not in d.models  # compiled is not served: no spec of token ids to check against
            assert not await d._served_spec("enc")
            r.hset(key, mapping={"spec": TEXT.to_json(), "status": "READY"})  # the executor, warm
            assert await d._served_spec("enc") and d.models["enc"] == TEXT  # taken at once by "ready"
            r.hset(key, mapping={"spec": PLAN.to_json(), "status": "COMPILED"})  # a new version deployed
            await d.refresh()
            assert d.models["enc"] == TEXT and await d._served_spec("enc")  # the old one still answers
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key)
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
            r.hset(key, mapping={"spec": PLAN.to_json(), "status": "COMPILED"})
            ok, why = await d.ready()
            assert not ok and "not yet published" in why and "enc" not in d.models
            r.hset(key, mapping={"spec": TEXT.to_json(), "status": "READY"})
            assert await d.ready() == (True, "") and d.models["enc"] == TEXT  # no refresh ran
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key, *svc)
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
            r.hset(key, mapping={"spec": TEXT.to_json(), "status": "READY"})
            assert not await d.learn("enc") and reads == 1  # asked a moment ago: not again this interval
            d._misses.clear()  # the interval has passed
            assert await d.learn("enc") and d.models["enc"] == TEXT and reads == 2
            assert not await d.learn("x" * 300) and reads == 2  # not a model name: no registry read
        finally:
            await d.registry.redis.aclose()

    try:
        asyncio.run(run())
    finally:
        r.delete(key)
        r.close()
