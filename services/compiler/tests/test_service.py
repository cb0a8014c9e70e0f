"""The compile API against a real Redis: jobs, the content-addressed cache (a repeat is served in
<= 50 ms), single-flight (two concurrent identical requests compile once), and bad models that
fail their job while the service keeps serving."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from onnx_models import mlp_bytes

from anvil_compiler.app import create_app
from anvil_compiler.settings import CompilerSettings
from anvil_core import keys

OPTS = json.dumps({"max_batch": 4, "archs": ["sm_90"]})


def _post(client: TestClient, data: bytes, name: str = "m") -> dict[str, Any]:
    r = client.post("/v1/compile", files={"file": ("m.onnx", data)}, data={"name": name, "options": OPTS})
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _wait(client: TestClient, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if doc["status"] in ("done", "failed"):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture
def client(redis_url: str, tmp_path: Path) -> Any:
    settings = CompilerSettings(
        redis_url=redis_url,
        artifact_dir=str(tmp_path / "art"),
        service_id="c-test",
        max_concurrent_jobs=2,
        job_timeout_s=300,
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_compile_cache_and_single_flight(client: TestClient, redis_url: str) -> None:
    import redis

    data = mlp_bytes(seed=3)
    with ThreadPoolExecutor(2) as pool:  # two identical requests at once
        a, b = pool.map(lambda _: _post(client, data), range(2))
    assert a["id"] == b["id"]  # the second joined the first job: one compile
    done = _wait(client, a["id"])
    assert done["status"] == "done" and not done["cached"], done
    manifest = client.get(f"/v1/artifacts/{done['artifact_id']}").json()
    assert set(manifest["files"]) >= {"plan.bin", "weights.safetensors", "kernels.cu"}
    assert manifest["spec"]["inputs"][0] == {"name": "x", "datatype": "FP32", "dims": [64]}
    r = client.get(f"/v1/artifacts/{done['artifact_id']}/files/plan.bin")
    assert r.status_code == 200 and r.content[4:8] == b"ANVP"
    assert redis.Redis.from_url(redis_url).exists(keys.artifact_key(done["artifact_id"]))

    t0 = time.perf_counter()
    again = _post(client, data)
    assert time.perf_counter() - t0 <= 0.05
    assert again["status"] == "done" and again["cached"] and again["artifact_id"] == done["artifact_id"]


def test_bad_models_fail_their_job_and_service_keeps_serving(client: TestClient) -> None:
    bad = _wait(client, _post(client, mlp_bytes(op="Selu"))["id"])
    assert bad["status"] == "failed" and "Selu" in bad["error"] and "'act'" in bad["error"]
    truncated = _wait(client, _post(client, mlp_bytes()[:200])["id"])
    assert truncated["status"] == "failed" and truncated["error_stage"] == "load"
    assert client.get("/v1/health").json()["live"] is True
    ok = _wait(client, _post(client, mlp_bytes(seed=4))["id"])
    assert ok["status"] == "done"


def test_bad_requests_are_400(client: TestClient) -> None:
    assert client.post("/v1/compile", data={"name": "m"}).status_code == 400
    r = client.post("/v1/compile", files={"file": ("m", b"x")}, data={"options": '{"group_size": 7}'})
    assert r.status_code == 400 and "group_size" in r.text
    assert client.get("/v1/jobs/nope").status_code == 404
    assert client.get("/v1/artifacts/nope").status_code == 404
