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


def test_publish_served_cannot_overwrite_an_undeploy_or_a_newer_artifact(redis_url: str) -> None:
    run(redis_url, lambda r: dep.deploy(r, "m", "a1", SPEC))
    served = json.dumps(dict(SPEC, version="1"))
    assert run(redis_url, lambda r: dep.publish_served(r, "m", "a1", served, "1"))
    assert run(redis_url, lambda r: dep.read(r, "m")).status == dep.READY
    run(redis_url, lambda r: dep.deploy(r, "m", "a2", SPEC))  # a new version while a1 serves
    assert not run(redis_url, lambda r: dep.publish_served(r, "m", "a1", served, "1"))  # a1's late beat
    assert run(redis_url, lambda r: dep.read(r, "m")).status == dep.COMPILED
    run(redis_url, lambda r: dep.undeploy(r, "m"))
    assert not run(redis_url, lambda r: dep.publish_served(r, "m", "a2", served, "2"))
    assert run(redis_url, lambda r: dep.read(r, "m")).status == dep.UNLOADED


def test_a_record_lost_with_redis_is_recreated_by_the_executor_that_serves_it(redis_url: str) -> None:
    served = json.dumps(dict(SPEC, version="4"))
    assert run(redis_url, lambda r: dep.publish_served(r, "m", "a9", served, "4"))  # no record at all
    d = run(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.artifact, d.version) == (dep.READY, "a9", "4")


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


def test_unload_keeps_the_repository_and_load_serves_the_newest_again(redis_url: str) -> None:
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
    run(redis_url, lambda r: dep.publish_served(r, "mlp", "", served, "1"))  # an executor's beat
    run(redis_url, lambda r: dep.unload(r, "mlp"))
    assert not run(redis_url, lambda r: dep.publish_served(r, "mlp", "", served, "1"))
    assert run(redis_url, lambda r: dep.index(r)) == [
        {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    assert "built-in" in run(redis_url, lambda r: dep.load(r, "mlp"))
    assert run(redis_url, lambda r: dep.read(r, "mlp")) is None  # the executors' beats re-create it
    assert run(redis_url, lambda r: dep.publish_served(r, "mlp", "", served, "1"))


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
