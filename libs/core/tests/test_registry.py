"""Registry against a real Redis: TTL expiry, re-registration after a flush, deregistration."""

from __future__ import annotations

import asyncio

import pytest
import redis

from anvil_core import keys
from anvil_core.registry import Registry
from anvil_core.settings import redact_url


async def _registry(url: str, sid: str, ttl_s: float = 0.3) -> Registry:
    reg = Registry(url, "executor", sid, ttl_s=ttl_s, interval_s=0.05, fields=lambda: {"models": ["mlp"]})
    await reg.start()
    return reg


def test_entry_is_visible_and_deleted_on_stop(redis_url: str) -> None:
    async def scenario() -> None:
        reg = await _registry(redis_url, "a")
        found = await reg.services("executor")
        assert [r["id"] for r in found] == ["a"]
        assert found[0]["models"] == '["mlp"]'
        await reg.stop()
        assert not redis.Redis.from_url(redis_url).exists(keys.svc_key("executor", "a"))

    asyncio.run(scenario())


def test_entry_expires_without_heartbeats(redis_url: str) -> None:
    async def scenario() -> None:
        reg = await _registry(redis_url, "b", ttl_s=0.2)
        assert reg._task is not None
        reg._task.cancel()  # the process "dies": no more beats
        client = redis.Redis.from_url(redis_url)
        ttl_ms = client.pttl(keys.svc_key("executor", "b"))
        assert 0 < ttl_ms <= 200
        await asyncio.sleep(0.3)  # the TTL itself is the behaviour under test
        assert not client.exists(keys.svc_key("executor", "b"))

    asyncio.run(scenario())


def test_flushed_registry_is_rewritten_by_the_next_beat(redis_url: str) -> None:
    async def scenario() -> None:
        reg = await _registry(redis_url, "c")
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # what a Redis restart looks like to the registry
        assert await reg.beat()
        assert client.exists(keys.svc_key("executor", "c"))
        await reg.stop()

    asyncio.run(scenario())


def test_unreachable_redis_is_reported_not_raised() -> None:
    async def scenario() -> None:
        reg = Registry("redis://127.0.0.1:1/0", "gateway", "d", ttl_s=1, interval_s=1)
        assert await reg.beat() is False
        assert not reg.connected
        await reg.redis.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("redis://user:pw@h", "redis://user:***@h"),
    ],
)
def test_secrets_are_redacted(url: str, want: str) -> None:
    assert redact_url(url) == want
    assert "s3cret" not in redact_url(url)
