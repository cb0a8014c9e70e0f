"""The HTTP edge's bounds (issue #18): a body larger than the model can need is refused from its
Content-Length before it is read (chunked ones as soon as they pass it), a large body is parsed
without stalling the event loop, and the shm routes take API keys and keep tenants apart."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_gateway.app import create_app
from anvil_gateway.body_limits import JSON_BYTES_PER_ELEMENT, SKELETON_BYTES
from anvil_gateway.settings import GatewaySettings

FIXED = ModelSpec("fixed", max_batch=2, inputs=(TensorSpec("x", "FP32", (4,)),), outputs=())
BIG = ModelSpec("big", max_batch=0, inputs=(TensorSpec("x", "FP32", (-1,)),), outputs=())
FIXED_LIMIT = SKELETON_BYTES + 2 * 4 * JSON_BYTES_PER_ELEMENT


_APPS: list[FastAPI] = []


def _app(**settings: Any) -> FastAPI:
    s = GatewaySettings(
        redis_url="redis://127.0.0.1:1/0",
        service_id=f"gw-{uuid.uuid4().hex[:6]}",
        zmq_curve=False,
        **settings,
    )
    app = create_app(s)  # no lifespan: no scheduler, no registry; the models are set by hand
    app.state.gw.discovery.models = {"fixed": FIXED, "big": BIG}
    _APPS.append(app)
    return app


@pytest.fixture(autouse=True)
def _close_apps() -> Iterator[None]:
    """The link's ZeroMQ context: left to the garbage collector, its term() would block."""
    yield
    while _APPS:
        app = _APPS.pop()
        app.state.link.ctx.destroy(linger=0)
        app.state.gw.parse_pool.shutdown(wait=True)


async def _call(
    app: FastAPI, path: str, chunks: list[bytes], headers: dict[str, str]
) -> tuple[int, Any, int]:
    """POST `chunks` as the ASGI body (headers as given); returns status, JSON body, bytes read."""
    sent = {"read": 0, "i": 0}
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        i = sent["i"]
        if i >= len(chunks):
            await asyncio.sleep(3600)  # a client that sends nothing more
        sent["i"] += 1
        sent["read"] += len(chunks[i])
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        else:
            out["body"] += msg.get("body", b"")

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("test", 80),
        "client": ("test", 1),
        "root_path": "",
        "app": app,
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    return out["status"], json.loads(out["body"]), sent["read"]


def test_a_body_over_the_models_limit_is_refused_unread() -> None:
    status, doc, read = asyncio.run(
        _call(_app(), "/v2/models/fixed/infer", [b"x" * 1000] * 100, {"content-length": "100000"})
    )
    assert status == 413 and read == 0
    assert f"limit of {FIXED_LIMIT} bytes" in doc["error"] and "max_batch 2" in doc["error"]
    # a model with a variable dim gets the global cap
    status, doc, read = asyncio.run(
        _call(_app(max_body_bytes=50_000), "/v2/models/big/infer", [b"x"], {"content-length": "60000"})
    )
    assert (
        status == 413 and read == 0 and "limit of 50000 bytes (the server's max_body_bytes)" in doc["error"]
    )


def test_a_chunked_body_is_cut_off_as_it_passes_the_limit() -> None:
    chunks = [b" " * 4096] * 1000  # 4 MB offered, no Content-Length
    status, doc, read = asyncio.run(_call(_app(), "/v2/models/fixed/infer", chunks, {}))
    assert status == 413 and f"limit of {FIXED_LIMIT}" in doc["error"]
    assert read <= FIXED_LIMIT + 4096


def test_an_unknown_model_is_404_before_its_body_is_read() -> None:
    status, doc, read = asyncio.run(
        _call(_app(), "/v2/models/nope/infer", [b"{}"] * 3, {"content-length": "6"})
    )
    assert status == 404 and read == 0 and "unknown model 'nope'" in doc["error"]


def test_a_large_body_does_not_stall_the_event_loop() -> None:
    """The event loop keeps running while a ~20 MB JSON body is parsed: a timer due every 2 ms is
    late by a small part of the parse's own time at worst (inline, as before: late by the whole
    parse, a ratio of ~1.0; here one ~0.25 ms step plus what the OS adds: 0.11-0.15 at load ~11 on
    the shared 2-core machine), and `/v2/health/live` answers meanwhile. The probe over a real
    socket is `bench/json_stall.py` (the in-process ASGI client takes tens of loop turns per
    request, each turn one step of the parse)."""
    n = 1_000_000  # ~20 MB of JSON
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [n],
                    "data": np.random.default_rng(1).standard_normal(n).tolist(),
                }
            ]
        }
    ).encode()
    app = _app()

    async def scenario() -> tuple[float, float, int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            await client.get("/v2/health/live")
            small = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
            await client.post("/v2/models/big/infer", json=small)  # FastAPI builds its route models
            done = asyncio.Event()
            worst, answered = 0.0, 0

            async def timer() -> None:
                nonlocal worst
                while not done.is_set():
                    due = time.perf_counter() + 0.002
                    await asyncio.sleep(0.002)
                    worst = max(worst, time.perf_counter() - due)

            async def probe() -> None:
                nonlocal answered
                while not done.is_set():
                    assert (await client.get("/v2/health/live")).status_code == 200
                    answered += 1
                    await asyncio.sleep(0.005)

            tasks = [asyncio.create_task(timer()), asyncio.create_task(probe())]
            await asyncio.sleep(0.01)
            answered = 0
            t0 = time.perf_counter()
            r = await client.post("/v2/models/big/infer", content=body)
            took = time.perf_counter() - t0
            done.set()
            await asyncio.gather(*tasks)
            return worst, took, r.status_code, answered

    worst, took, status, answered = asyncio.run(scenario())
    assert status == 503  # parsed and validated; then no scheduler to send it to
    assert worst < 0.25 * took, f"the loop was late {worst * 1e3:.1f} ms during a {took * 1e3:.1f} ms request"
    assert answered >= 1  # the health route answered while the body was parsed


@pytest.fixture
def shm_key() -> Iterator[str]:
    key = f"/anvil-test-{uuid.uuid4().hex}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


def test_shm_routes_take_api_keys_and_keep_tenants_apart(shm_key: str) -> None:
    app = _app(allow_client_shm=True, require_api_key=True)
    keys = {"alice": "key-a", "bob": "key-b"}
    app.state.gw.admission.load({}, {hashlib.sha256(k.encode()).hexdigest(): t for t, k in keys.items()})

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            reg = {"key": shm_key, "offset": 0, "byte_size": 64}
            for method, path in [
                ("GET", "/v2/systemsharedmemory/status"),
                ("GET", "/v2/systemsharedmemory/region/r/status"),
                ("POST", "/v2/systemsharedmemory/region/r/register"),
                ("POST", "/v2/systemsharedmemory/region/r/unregister"),
                ("POST", "/v2/systemsharedmemory/unregister"),
                ("GET", "/v2/cudasharedmemory/status"),
                ("POST", "/v2/cudasharedmemory/unregister"),
            ]:
                r = await c.request(method, path, json=reg if "register" in path else None)
                assert r.status_code == 401, (path, r.text)
                r = await c.request(method, path, headers={"x-api-key": "wrong"})
                assert r.status_code == 401, (path, r.text)
            a, b = {"x-api-key": keys["alice"]}, {"authorization": f"Bearer {keys['bob']}"}
            assert (
                await c.post("/v2/systemsharedmemory/region/r/register", json=reg, headers=a)
            ).status_code == 200
            assert (await c.get("/v2/systemsharedmemory/status", headers=a)).json()[0]["name"] == "r"
            assert (await c.get("/v2/systemsharedmemory/status", headers=b)).json() == []
            assert (await c.get("/v2/systemsharedmemory/region/r/status", headers=b)).status_code == 404
            r = await c.post("/v2/systemsharedmemory/region/r/register", json=reg, headers=b)
            assert r.status_code == 403 and "another tenant" in r.json()["error"]
            assert (await c.post("/v2/systemsharedmemory/unregister", headers=b)).status_code == 200
            assert len(app.state.gw.shm.regions) == 1  # bob's unregister-all left alice's region
            doc = {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16},
                    }
                ]
            }
            r = await c.post("/v2/models/fixed/infer", json=doc, headers=b)
            assert r.status_code == 400 and "'r' is not registered" in r.json()["error"]
            r = await c.post("/v2/models/fixed/infer", json=doc, headers=a)
            assert r.status_code == 503  # alice's region read; then no scheduler here
            assert (await c.post("/v2/systemsharedmemory/unregister", headers=a)).status_code == 200
            assert app.state.gw.shm.regions == {}

    asyncio.run(scenario())


def test_a_parse_whose_caller_is_cancelled_hands_its_result_to_orphan() -> None:
    """A client that hangs up mid-parse: the thread's result (regions it pinned) is still released."""
    from anvil_gateway.infer import parse_off_loop

    st = _app().state.gw
    orphaned: list[str] = []
    started = threading.Event()

    def slow_parse(value: str, bulk: bool = False) -> str:
        started.set()
        time.sleep(0.2)
        return value + (" bulk" if bulk else "")

    async def scenario() -> None:
        task = asyncio.create_task(parse_off_loop(st, 1 << 30, slow_parse, "parsed", orphan=orphaned.append))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert orphaned == []  # the thread is still parsing
        st.parse_pool.shutdown(wait=True)  # the parse ends; its done-callback is scheduled
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert orphaned == ["parsed bulk"]


def test_what_is_parsed_in_steps_is_decided_by_the_json_to_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A binary-extension body's tensors are views of the body, never walked: a 1 MiB binary section
    with a short JSON header is parsed in one go (steps would cost more than the parse), the same
    tensor as 1 MiB-plus of JSON text in steps on the event loop, yielding to other tasks between
    them; both on the loop's thread (no parse thread holds the GIL the loop needs)."""
    import anvil_gateway.infer as infer_mod

    threads: list[str] = []
    steps: list[int] = []
    real_parse, real_run = infer_mod.parse_request, infer_mod.run_steps

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real_parse(*args, **kwargs)

    async def counting(gen: Any) -> Any:
        def counted() -> Any:
            steps.append(0)
            result = yield from gen
            return result

        def tick(g: Any) -> Any:
            while True:
                try:
                    next(g)
                except StopIteration as done:
                    return done.value
                steps[-1] += 1
                yield

        return await real_run(tick(counted()))

    monkeypatch.setattr(infer_mod, "parse_request", recording)
    monkeypatch.setattr(infer_mod, "run_steps", counting)
    x = np.random.default_rng(2).standard_normal(1 << 18).astype(np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [x.size],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    binary = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [x.size], "data": x.tolist()}]}
    app = _app()
    for body, headers in ((head + x.tobytes(), binary), (json.dumps(doc).encode(), {})):
        headers = {**headers, "content-length": str(len(body))}
        status, _, _ = asyncio.run(_call(app, "/v2/models/big/infer", [body], headers))
        assert status == 503  # parsed and validated; then no scheduler to send it to
        if len(steps) == 0:
            assert threads == [threading.current_thread().name]  # the binary body: one call, no steps
    loop_thread = threading.current_thread().name  # asyncio.run runs the loop on this thread
    assert threads == [loop_thread, loop_thread]
    from anvil_gateway.json_bulk import STEP_BYTES

    assert len(steps) == 1 and steps[0] >= len(json.dumps(doc)) // STEP_BYTES, (
        steps
    )  # a step or two per step of text


def test_an_answers_encoding_cost_counts_json_numbers_not_raw_bytes() -> None:
    from anvil_core.tensors import HostTensor
    from anvil_gateway.kserve import BINARY_BYTES_PER_COST, OutputRequest, ParsedRequest, answer_cost

    out = HostTensor.from_array("y", "FP32", np.zeros(1 << 16, np.float32))
    as_json = ParsedRequest(None, [], [OutputRequest("y")], {})
    as_binary = ParsedRequest(None, [], [], {"binary_data_output": True})
    in_shm = ParsedRequest(None, [], [OutputRequest("y", shm=("r", 0, out.nbytes))], {})
    assert answer_cost(as_json, [out], 20) == 20 * (1 << 16)
    assert answer_cost(as_binary, [out], 20) == out.nbytes // BINARY_BYTES_PER_COST
    assert answer_cost(in_shm, [out], 20) == out.nbytes // BINARY_BYTES_PER_COST
