"""The executor's model-loading loop (loader.py) against a real Redis, with stand-in models: a failing
load backs off exponentially and is logged and published once per state change; placement, version
switches, undeploy and the repository's unload/load of a built-in are followed."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from anvil_core import deployments as dep
from anvil_core import keys
from anvil_core.model_spec import ModelSpec
from anvil_core.registry import connect_redis
from anvil_executor import loader as loader_mod
from anvil_executor.loader import ModelLoader

SPEC = {"name": "m", "max_batch": 4, "inputs": [], "outputs": []}


class Stub:
    def __init__(self, name: str, tag: str = "") -> None:
        self.spec = ModelSpec(name, max_batch=4)
        self.tag = tag


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()


def beat(redis_url: str, loader: ModelLoader) -> None:
    """One registry beat, then wait for the loads it started (threads) to end."""

    async def go() -> None:
        r = connect_redis(redis_url)
        try:
            await loader.sync(r)
        finally:
            await r.aclose()

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while loader._loading:
        assert time.monotonic() < deadline, "a load never ended"
        time.sleep(0.005)


def registry(redis_url: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        r = connect_redis(redis_url)
        try:
            return await fn(r)
        finally:
            await r.aclose()

    return asyncio.run(go())


def test_a_failing_load_backs_off_and_is_reported_once_per_state_change(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import redis

    clock = Clock()
    monkeypatch.setattr(loader_mod, "time", clock)
    attempts: list[float] = []
    error = ["no such artifact directory"]

    def load_artifact(name: str, artifact: str) -> Any:
        attempts.append(clock.now)
        if error[0]:
            raise OSError(error[0])
        return Stub(name, artifact)

    changes: list[int] = []
    ld = ModelLoader("e1", "cpu", {}, Stub, load_artifact, lambda: changes.append(1), 1.0, 8.0)
    sub = redis.Redis.from_url(redis_url).pubsub()
    sub.subscribe(keys.EVENTS)
    registry(redis_url, lambda r: dep.deploy(r, "m", "abcd1234", SPEC))
    caplog.set_level(logging.DEBUG, logger="anvil.executor.loader")
    for _ in range(40):  # 10 s of beats, 250 ms apart
        beat(redis_url, ld)
        clock.now += 0.25
    # 1, 2, 4, 8 s apart (capped at 8): attempts at 0, 1, 3 and 7 s, not one per beat
    assert [a - 1000.0 for a in attempts] == [0.0, 1.0, 3.0, 7.0]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["cannot load model; retrying with back-off"]
    assert "abcd1234: OSError: no such artifact directory" in ld.load_errors()["m"]

    error[0] = "permission denied"  # a different failure is a new state: reported once more
    clock.now += 8
    for _ in range(3):
        beat(redis_url, ld)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
    failed = [
        json.loads(m["data"])
        for m in iter(lambda: sub.get_message(timeout=0.5), None)
        if m["type"] == "message" and b"model_load_failed" in m["data"]
    ]
    assert [f["error"] for f in failed] == [
        "OSError: no such artifact directory",
        "OSError: permission denied",
    ]

    error[0] = ""  # recovered
    clock.now += 16
    beat(redis_url, ld)
    assert ld.models["m"].tag == "abcd1234" and ld.load_errors() == {} and changes == [1]
    assert any(r.getMessage() == "model loaded" and r.failed_attempts == "5" for r in caplog.records)


def test_placement_versions_undeploy_and_a_built_in_unloaded_and_loaded_again(redis_url: str) -> None:
    loads: list[str] = []

    def load_artifact(name: str, artifact: str) -> Any:
        loads.append(artifact)
        return Stub(name, artifact)

    changes: list[int] = []
    ld = ModelLoader("cpu-ex-1", "cpu", {"mlp": Stub("mlp")}, Stub, load_artifact, lambda: changes.append(1))

    registry(redis_url, lambda r: dep.deploy(r, "m", "aaaa0001", SPEC, placement={"devices": ["cuda:*"]}))
    beat(redis_url, ld)
    assert "m" not in ld.models and loads == []  # not placed on a CPU executor
    assert registry(redis_url, lambda r: dep.read(r, "mlp")).status == dep.READY  # the built-in advertised

    registry(redis_url, lambda r: dep.deploy(r, "m", "aaaa0002", SPEC, placement={"executors": ["cpu-ex-*"]}))
    beat(redis_url, ld)
    beat(redis_url, ld)  # the next beat advertises it
    assert ld.models["m"].tag == "aaaa0002" and ld.models["m"].spec.version == "2"
    d = registry(redis_url, lambda r: dep.read(r, "m"))
    assert (d.status, d.version) == (dep.READY, "2")

    registry(redis_url, lambda r: dep.deploy(r, "m", "aaaa0003", SPEC))  # a new version: switch
    beat(redis_url, ld)
    assert ld.models["m"].tag == "aaaa0003" and ld.models["m"].spec.version == "3"

    registry(redis_url, lambda r: dep.deploy(r, "m", "aaaa0003", SPEC, placement={"devices": ["cuda:0"]}))
    beat(redis_url, ld)
    assert "m" not in ld.models  # its placement moved off this executor

    registry(redis_url, lambda r: dep.deploy(r, "m", "aaaa0003", SPEC))
    beat(redis_url, ld)
    assert ld.models["m"].spec.version == "5"
    registry(redis_url, lambda r: dep.undeploy(r, "m"))
    beat(redis_url, ld)
    assert "m" not in ld.models

    registry(redis_url, lambda r: dep.unload(r, "mlp"))
    beat(redis_url, ld)
    assert "mlp" not in ld.models
    beat(redis_url, ld)
    assert "mlp" not in ld.models  # stays unloaded: the mark is honoured at every beat
    registry(redis_url, lambda r: dep.load(r, "mlp"))
    beat(redis_url, ld)
    assert "mlp" in ld.models
    beat(redis_url, ld)
    assert registry(redis_url, lambda r: dep.read(r, "mlp")).status == dep.READY
    assert loads == ["aaaa0002", "aaaa0003", "aaaa0003"] and len(changes) == 7
