"""Admission: token buckets per (tenant, priority), API keys, the in-flight bound."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from anvil_gateway.admission import Admission, Rejected, TokenBucket, hash_key


def test_bucket_allows_the_burst_then_the_rate() -> None:
    b = TokenBucket(rate_rps=10, burst=3, tokens=3, at_s=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take(0.0)
    assert wait == pytest.approx(0.1)
    assert b.take(0.1) == 0.0  # one token refilled after 100 ms


def _adm(limits: dict[str, object], tenants: dict[str, str] | None = None, inflight: int = 100) -> Admission:
    a = Admission(require_api_key=False, max_inflight_per_model=inflight)
    a.load({k: json.dumps(v) for k, v in limits.items()}, tenants or {})
    return a


def test_rate_limit_applies_per_tenant_and_priority() -> None:
    a = _adm({"acme:3": {"rate_rps": 1, "burst": 1}})
    a.admit("m", "acme", 3, now_s=0.0)
    with pytest.raises(Rejected) as info:
        a.admit("m", "acme", 3, now_s=0.0)
    assert info.value.status == 429 and info.value.retry_after_s == pytest.approx(1.0)
    assert "1 req/s" in str(info.value)
    a.admit("m", "acme", 1, now_s=0.0)  # other priorities are not limited
    a.admit("m", "other", 3, now_s=0.0)  # nor other tenants


def test_wildcards_and_precedence() -> None:
    a = _adm({"*:3": {"rate_rps": 0, "burst": 1}, "vip:3": {"rate_rps": 100, "burst": 100}})
    a.admit("m", "anyone", 3, 0.0)
    with pytest.raises(Rejected):
        a.admit("m", "anyone", 3, 0.0)
    for _ in range(50):
        a.admit("m", "vip", 3, 0.0)


def test_new_limits_apply_to_existing_buckets() -> None:
    a = _adm({"t:2": {"rate_rps": 1000, "burst": 1000}})
    a.admit("m", "t", 2, 0.0)
    a.load({"t:2": json.dumps({"rate_rps": 1, "burst": 1})}, {})
    a.admit("m", "t", 2, 0.0)
    with pytest.raises(Rejected):
        a.admit("m", "t", 2, 0.0)
    a.load({}, {})  # limit removed: unlimited again
    for _ in range(10):
        a.admit("m", "t", 2, 0.0)


def test_malformed_limits_are_ignored() -> None:
    a = Admission(False, 10)
    a.load({"t:1": "not json", "t:2": json.dumps({"burst": 3})}, {})
    assert a.limits == {}


def test_inflight_bound() -> None:
    a = _adm({}, inflight=2)
    a.admit("m", "t", 2, 0.0)
    a.admit("m", "t", 2, 0.0)
    with pytest.raises(Rejected, match="in flight") as info:
        a.admit("m", "t", 2, 0.0)
    assert info.value.retry_after_s == 1.0
    a.done("m")
    a.admit("m", "t", 2, 0.0)


def test_api_keys() -> None:
    a = _adm({}, tenants={hash_key("s3cret"): "acme"})
    assert a.tenant({"authorization": "Bearer s3cret"}) == "acme"
    assert a.tenant({"x-api-key": "s3cret"}) == "acme"
    assert a.tenant({}) == "default"
    assert a.tenant({"x-api-key": "wrong"}) == "default"  # keys optional: unknown means default
    a.require_api_key = True
    assert a.tenant({"x-api-key": "s3cret"}) == "acme"
    with pytest.raises(Rejected, match="unknown API key") as info:
        a.tenant({"x-api-key": "wrong"})
    assert info.value.status == 401 and "wrong" not in str(info.value)
    with pytest.raises(Rejected, match="required"):
        a.tenant({})


def test_names_that_are_not_tenant_names_are_not_loaded() -> None:
    """A "*" tenant written into Redis by hand would alias the limits' wildcard: it is dropped."""
    a = Admission(True, 10)
    a.load(
        {
            "*:2": json.dumps({"rate_rps": 5}),
            "acme:*": json.dumps({"rate_rps": 1}),
            "a:b:c": "{}",
            "x:9": "{}",
        },
        {hash_key("k1"): "*", hash_key("k2"): "acme", hash_key("k3"): "bad name"},
    )
    assert set(a.limits) == {"*:2", "acme:*"}
    assert a.tenant({"x-api-key": "k2"}) == "acme"
    for key in ("k1", "k3"):
        with pytest.raises(Rejected, match="unknown API key"):
            a.tenant({"x-api-key": key})


def test_a_late_event_loop_sheds_lower_priorities_first_and_never_priority_1() -> None:
    """#19: the loop's delay is probed by admissions; past a priority's threshold it gets 429 while
    more important requests are coming (and only then)."""
    a = Admission(require_api_key=False, max_inflight_per_model=100, shed_delay_ms={2: 25, 3: 10})

    def outcome(priority: int) -> int:
        try:
            a.admit("m", "t", priority, time.monotonic())
        except Rejected as exc:
            return exc.status
        a.done("m")
        return 200

    async def stall(priority: int) -> None:
        """An admission arms a probe, then the loop's turn takes 40 ms before the probe can run."""
        assert outcome(priority) == 200
        time.sleep(0.04)
        await asyncio.sleep(0)  # the probe runs: a 40 ms reading

    async def alone() -> int:
        """Batch-class traffic alone: shedding it would free the CPU for nobody."""
        await stall(3)
        await stall(3)
        return outcome(3)

    assert asyncio.run(alone()) == 200

    async def main() -> tuple[list[int], list[int], list[int], list[int]]:
        calm = [outcome(p) for p in (1, 2, 3)]  # arms a probe that runs at once
        await asyncio.sleep(0)
        await stall(1)
        once = [outcome(p) for p in (1, 2, 3)]  # one late reading (and a fresh probe): a stall, not late
        await asyncio.sleep(0.2)  # past the hold time
        await stall(1)
        await stall(1)
        stalled = [outcome(p) for p in (1, 2, 3)]  # two late readings in a row
        await asyncio.sleep(0.2)  # past the hold time, the loop idle: everyone is served again
        later = [outcome(p) for p in (3, 2, 1)]
        return calm, once, stalled, later

    calm, once, stalled, later = asyncio.run(main())
    assert calm == once == later == [200, 200, 200]
    assert stalled == [200, 429, 429]
