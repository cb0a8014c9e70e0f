"""The KServe repository routes (routes_meta.py) over a real Redis: the API key is checked like on the
inference routes, index shows the registry's states, unload/load change the record, unknown -> 404."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from anvil_core import deployments as dep
from anvil_core.registry import connect_redis
from anvil_gateway import routes_meta
from anvil_gateway.admission import Admission, hash_key

SPEC = {"name": "m", "max_batch": 4, "inputs": [], "outputs": []}


class StubDiscovery:
    def __init__(self) -> None:
        self.refreshed = 0

    async def refresh(self) -> None:
        self.refreshed += 1

    async def ready(self, model: str | None = None) -> tuple[bool, str]:
        return True, ""


def test_repository_routes(redis_url: str) -> None:
    admission = Admission(require_api_key=True, max_inflight_per_model=8)
    admission.load({}, {hash_key("secret"): "acme"})
    app = FastAPI()
    app.include_router(routes_meta.router)

    async def deploy() -> None:
        r = connect_redis(redis_url)
        try:
            await dep.deploy(r, "m", "abcd0001", SPEC)
        finally:
            await r.aclose()

    asyncio.run(deploy())
    with TestClient(app) as client:
        redis = connect_redis(redis_url)  # created on the app's loop (TestClient's portal)
        st: Any = SimpleNamespace(
            admission=admission,
            registry=SimpleNamespace(redis=redis),
            discovery=StubDiscovery(),
            settings=SimpleNamespace(repository_load_wait_ms=1000),
        )
        app.state.gw = st
        for path in (
            "/v2/repository/index",
            "/v2/repository/models/m/unload",
            "/v2/repository/models/m/load",
        ):
            assert client.post(path).status_code == 401
            r = client.post(path, headers={"x-api-key": "wrong"})
            assert r.status_code == 401 and "unknown API key" in r.json()["error"]
        key = {"x-api-key": "secret"}
        assert client.post("/v2/repository/index", headers=key).json() == [
            {"name": "m", "version": "1", "state": "LOADING", "reason": "no executor serves it yet"}
        ]
        r = client.post("/v2/repository/models/m/unload", headers=key, json={"parameters": {}})
        assert r.status_code == 200 and st.discovery.refreshed == 1
        assert client.post("/v2/repository/index", headers=key).json()[0]["state"] == "UNAVAILABLE"
        assert client.post("/v2/repository/models/m/load", headers=key).status_code == 200
        assert client.post("/v2/repository/index", headers=key).json()[0]["state"] == "LOADING"
        r = client.post("/v2/repository/models/nosuch/unload", headers=key)
        assert r.status_code == 404 and "nosuch" in r.json()["error"]
        client.portal.call(redis.aclose)  # type: ignore[union-attr]
