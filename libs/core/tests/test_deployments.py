"""The registry's deploy/undeploy mechanism (``anvil_core.deployments``) against a real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from anvil_core import deployments as dep
from anvil_core import keys
from anvil_core.registry import connect_redis

SPEC = {"name": "m", "max_batch": 8, "inputs": [], "outputs": []}


def run(redis_url: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        r = connect_redis(redis_url)
        try:
            return await fn(r)
        finally:
            await r.aclose()

    return asyncio.run(go())


def test_versions_count_up_and_the_served_one_is_replaced_whole(redis_url: str) -> None:
    assert run(redis_url, lambda r: dep.deploy(r, "m", "a1", SPEC, placement={"devices": ["cpu"]})) == "1"
    assert run(redis_url, lambda r: dep.deploy(r, "m", "a2", SPEC)) == "2"
    assert run(redis_url, lambda r: dep.deploy(r, "m", "a3", SPEC, version="exp")) == "exp"
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.version, d.artifact, d.versions) == (dep.COMPILED, "exp", "a3", ("1", "2", "exp"))
    assert d.placement == {}  # version 1's placement did not survive into the record of "exp"
    assert run(redis_url, lambda r: dep.deploy(r, "m", "a4", SPEC)) == "3"  # above the highest number
    with pytest.raises(ValueError, match="version"):
        run(redis_url, lambda r: dep.deploy(r, "m", "a5", SPEC, version="a/b"))


def _advertise(redis_url: str, executor: str, models: dict[str, tuple[str, str, str]]) -> None:
    run(redis_url, lambda r: dep.publish_served(r, executor, models, 10_000))


def test_ready_means_a_live_executor_serves_the_deployed_artifact(redis_url: str) -> None:
    """READY is derived from the executors' own advertisements, never written into the record: an
    executor late with the old artifact, or serving a model that was undeployed, changes nothing."""
    run(redis_url, lambda r: dep.deploy(r, "m", "a1", SPEC))
    served = json.dumps(dict(SPEC, version="1", inputs=["served"]))
    _advertise(redis_url, "e1", {"m": ("a1", "1", served)})
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.spec, d.served_by) == (dep.READY, served, ("e1",))  # the spec it serves
    run(redis_url, lambda r: dep.deploy(r, "m", "a2", SPEC))  # a new version while a1 serves
    _advertise(redis_url, "e1", {"m": ("a1", "1", served)})  # a1's late beat
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.artifact, d.version) == (dep.COMPILED, "a2", "2")
    _advertise(redis_url, "e2", {"m": ("a2", "2", served)})
    assert run(redis_url, lambda r: dep.read(r, "m")).served_by == ("e2",)
    run(redis_url, lambda r: dep.undeploy(r, "m"))
    assert run(redis_url, lambda r: dep.read(r, "m")).status == dep.UNLOADED  # e2 still advertises it
    assert run(redis_url, lambda r: r.hgetall(keys.model_key("m"))) == {}
    _advertise(redis_url, "e1", {})  # an executor that serves nothing advertises nothing
    assert run(redis_url, lambda r: r.exists(keys.served_key("e1"))) == 0
    run(redis_url, lambda r: dep.withdraw_served(r, "e2"))


def test_an_advertisement_lives_as_long_as_its_executor_beats(redis_url: str) -> None:
    served = json.dumps(dict(SPEC, version="4"))
    _advertise(redis_url, "e9", {"m": ("a9", "4", served)})  # no record at all: a Redis restart
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.artifact, d.version) == (dep.READY, "a9", "4")
    ttl = run(redis_url, lambda r: r.pttl(keys.served_key("e9")))
    assert 0 < ttl <= 10_000  # gone with the executor that stops beating
    run(redis_url, lambda r: dep.withdraw_served(r, "e9"))
    assert run(redis_url, lambda r: dep.read(r, "m")) is None


def test_undeploy_one_version_serves_the_highest_left_then_the_whole_model(redis_url: str) -> None:
    for art in ("a1", "a2", "a3"):
        run(redis_url, lambda r, a=art: dep.deploy(r, "m", a, SPEC))
    assert "version 3 still serves" in run(redis_url, lambda r: dep.undeploy(r, "m", "1"))
    assert "version 2 serves now" in run(redis_url, lambda r: dep.undeploy(r, "m", "3"))
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.version, d.artifact, d.versions) == (dep.COMPILED, "2", "a2", ("2",))
    assert json.loads(run(redis_url, lambda r: r.hget(keys.model_key("m"), "spec")))["version"] == "2"
    with pytest.raises(dep.RepositoryError, match=r"no version '7'; versions: \['2'\]"):
        run(redis_url, lambda r: dep.undeploy(r, "m", "7"))
    assert "was its last" in run(redis_url, lambda r: dep.undeploy(r, "m", "2"))
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.reason, d.versions, d.artifact) == (dep.UNLOADED, "undeployed", (), "")
    with pytest.raises(dep.RepositoryError, match="no model 'm' is deployed"):
        run(redis_url, lambda r: dep.undeploy(r, "m"))


def test_unload_keeps_the_record_and_repository_and_load_serves_the_deployed_version_again(
    redis_url: str,
) -> None:
    run(redis_url, lambda r: dep.deploy(r, "m", "a1", SPEC))
    run(redis_url, lambda r: dep.deploy(r, "m", "a2", SPEC))
    run(redis_url, lambda r: dep.unload(r, "m"))
    index = run(redis_url, dep.index)
    assert {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"} in index
    assert {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "not the served version"} in index
    assert run(redis_url, lambda r: dep.load(r, "m")) == "loading m version 2"
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.version, d.artifact) == (dep.COMPILED, "2", "a2")
    assert {"name": "m", "version": "2", "state": "LOADING", "reason": "no executor serves it yet"} in run(
        redis_url, dep.index
    )
    with pytest.raises(dep.RepositoryError):
        run(redis_url, lambda r: dep.load(r, "nosuch"))
    with pytest.raises(dep.RepositoryError):
        run(redis_url, lambda r: dep.unload(r, "nosuch"))


def test_a_built_in_model_is_unloaded_by_a_mark_and_loaded_by_removing_it(redis_url: str) -> None:
    served = json.dumps({"name": "mlp", "version": "1", "inputs": [], "outputs": []})
    _advertise(redis_url, "e1", {"mlp": ("", "1", served)})  # an executor's beat
    run(redis_url, lambda r: dep.unload(r, "mlp"))
    assert run(redis_url, lambda r: dep.read(r, "mlp")).status == dep.UNLOADED  # whatever e1 says
    assert run(redis_url, lambda r: dep.index(r)) == [
        {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    assert "built-in" in run(redis_url, lambda r: dep.load(r, "mlp"))
    assert run(redis_url, lambda r: dep.read(r, "mlp")).status == dep.READY
    assert run(redis_url, lambda r: r.exists(keys.model_key("mlp"), keys.model_unloaded_key("mlp"))) == 0
    run(redis_url, lambda r: dep.withdraw_served(r, "e1"))


@pytest.mark.parametrize(
    ("placement", "device", "executor", "allowed"),
    [
        ({}, "cpu", "e1", True),
        ({"devices": ["cuda:*"]}, "cpu", "e1", False),
        ({"devices": ["cuda:*"]}, "cuda:1", "e1", True),
        ({"devices": ["cpu", "cuda:0"]}, "cuda:0", "e1", True),
        ({"executors": ["gpu-host-*"]}, "cuda:0", "gpu-host-7", True),
        ({"devices": ["cuda:*"], "executors": ["gpu-host-*"]}, "cuda:0", "other", False),
    ],
)
def test_placement(placement: dict[str, list[str]], device: str, executor: str, allowed: bool) -> None:
    assert dep.placement_allows(placement, device, executor) is allowed
    assert dep.parse_placement(json.dumps(placement)) == placement
    assert dep.parse_placement("not json") == {} == dep.parse_placement(None)
