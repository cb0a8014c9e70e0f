"""The compiler's HTTP API: health with the registry's state; its boundaries (API key, model_root,
upload cap, bounded job table)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from anvil_compiler import app as app_module
from anvil_compiler import model_paths
from anvil_compiler.app import create_app
from anvil_compiler.jobs import Job, JobManager, JobsFull
from anvil_compiler.model_paths import PathRefused, read_model
from anvil_compiler.options import CompileOptions
from anvil_compiler.settings import CompilerSettings
from anvil_core import keys


def test_health_reports_registry_and_artifact_dir(redis_url: str, tmp_path: Path) -> None:
    settings = CompilerSettings(redis_url=redis_url, artifact_dir=str(tmp_path / "a"), service_id="c1")
    with TestClient(create_app(settings)) as client:
        doc = client.get("/v1/health").json()
    assert doc == {"live": True, "registry": True, "artifact_dir_writable": True}


def test_health_without_redis_says_so(tmp_path: Path) -> None:
    settings = CompilerSettings(
        redis_url="redis://127.0.0.1:1/0", artifact_dir=str(tmp_path), service_id="c2"
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/health").json()["registry"] is False


# --- boundaries (issue #18) -------------------------------------------------------------------


def _settings(redis_url: str, tmp_path: Path, **kw: Any) -> CompilerSettings:
    return CompilerSettings(
        redis_url=redis_url, artifact_dir=str(tmp_path / "a"), service_id=f"c-{uuid.uuid4().hex[:6]}", **kw
    )


def test_model_root_defaults_under_the_artifact_dir(redis_url: str, tmp_path: Path) -> None:
    settings = _settings(redis_url, tmp_path)
    assert settings.model_root_path == tmp_path / "a" / "models"
    with TestClient(create_app(settings)) as client:
        assert (tmp_path / "a" / "models").is_dir()
        r = client.post("/v1/compile", data={"path": "/etc/passwd", "format": "onnx"})
        assert r.status_code == 400 and "not under the compiler's model_root" in r.text


def test_paths_that_leave_the_root_are_refused(redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "hf").mkdir(parents=True)
    outside = tmp_path / "secret.onnx"
    outside.write_bytes(b"weights of someone else")
    (root / "link.onnx").symlink_to(outside)
    (root / "hf" / "config.json").write_text("{}")
    (root / "hf" / "model.safetensors").symlink_to(outside)  # one file of a dir leads out
    (root / "inside.onnx").write_bytes(b"x")
    (root / "ok.onnx").symlink_to(root / "inside.onnx")  # a symlink within the root is fine
    settings = _settings(redis_url, tmp_path, model_root=str(root))
    with TestClient(create_app(settings)) as client:
        for path, fmt in [
            ("../secret.onnx", "onnx"),
            (str(outside), "onnx"),
            ("link.onnx", "onnx"),
            ("hf", "hf"),
            ("hf/../../secret.onnx", "onnx"),
        ]:
            r = client.post("/v1/compile", data={"path": path, "format": fmt})
            assert r.status_code == 400 and "not under the compiler's model_root" in r.text, (path, r.text)
    assert read_model(root, "ok.onnx", "onnx", 10) == b"x"
    with pytest.raises(PathRefused, match="exceeds the cap of 0") as info:
        read_model(root, "ok.onnx", "onnx", 0)
    assert info.value.status == 413


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "m.onnx").write_bytes(b"secret")
    (root / "d" / "m.onnx").write_bytes(b"mine")
    parts = ("d", "m.onnx")
    assert model_paths._read_beneath(root, parts, 100) == b"mine"
    (root / "d" / "m.onnx").unlink()
    (root / "d").rmdir()
    (root / "d").symlink_to(tmp_path / "out")  # the race: the checked path now leads out
    with pytest.raises(PathRefused, match="cannot be opened beneath the model_root"):
        model_paths._read_beneath(root, parts, 100)


def test_uploads_are_cut_off_as_the_stream_passes_the_cap(redis_url: str, tmp_path: Path) -> None:
    settings = _settings(redis_url, tmp_path, max_model_mib=1)
    cap = 2 * (1 << 20) + app_module.FORM_OVERHEAD_BYTES
    with TestClient(create_app(settings)) as client:
        r = client.post(
            "/v1/compile",
            content=b"x",
            headers={"content-length": str(cap + 1), "content-type": "multipart/form-data; boundary=b"},
        )
        assert r.status_code == 413 and f"cap of {cap}" in r.text
        r = client.post("/v1/compile", files={"file": ("m.onnx", b"\0" * ((1 << 20) + 1))})
        assert r.status_code == 413 and "larger than max_model_mib=1" in r.text


def test_a_chunked_upload_is_not_read_past_the_cap() -> None:
    cap, chunk = 1 << 20, 1 << 16
    pulled = 0

    async def receive() -> dict[str, Any]:  # a client with 64 MiB to send, no Content-Length
        nonlocal pulled
        first = pulled == 0
        pulled += chunk
        head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="m"\r\n\r\n'
        return {"type": "http.request", "body": (head if first else b"") + b"\0" * chunk, "more_body": True}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/compile",
        "query_string": b"",
        "headers": [(b"content-type", b"multipart/form-data; boundary=b")],
    }
    with pytest.raises(HTTPException) as info:
        asyncio.run(app_module._form(Request(scope, receive), cap))
    assert info.value.status_code == 413 and "cut off" in str(info.value.detail)
    assert pulled <= cap + chunk


def test_api_key_on_every_route_but_health(redis_url: str, tmp_path: Path) -> None:
    import redis

    tenant_key = f"anv_{uuid.uuid4().hex}"
    r = redis.Redis.from_url(redis_url)
    r.hset(keys.tenants_key(), hashlib.sha256(tenant_key.encode()).hexdigest(), "acme")
    routes = [
        ("POST", "/v1/compile"),
        ("GET", "/v1/jobs/x"),
        ("GET", "/v1/artifacts/x"),
        ("GET", "/v1/artifacts/x/files/plan.bin"),
    ]
    try:
        for kw, good, bad in [
            ({"compiler_api_key": "s3cret"}, ["s3cret"], [tenant_key, "nope"]),
            ({"require_api_key": True}, [tenant_key], ["s3cret", "nope"]),
        ]:
            with TestClient(create_app(_settings(redis_url, tmp_path, **kw))) as client:
                assert client.get("/v1/health").status_code == 200
                for method, path in routes:
                    assert client.request(method, path).status_code == 401, path
                    for key in bad:
                        assert client.request(method, path, headers={"x-api-key": key}).status_code == 401
                    for key in good:
                        got = client.request(method, path, headers={"authorization": f"Bearer {key}"})
                        assert got.status_code in (400, 404), (path, got.text)  # past the key check
    finally:
        r.hdel(keys.tenants_key(), hashlib.sha256(tenant_key.encode()).hexdigest())
        r.close()


class _Cached:
    """A cache where every key is already built: jobs finish at once."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def lookup(self, key: str) -> dict[str, Any]:
        return {"id": key}


def test_the_job_table_is_bounded(tmp_path: Path) -> None:
    jobs = JobManager(_Cached(tmp_path), 1, 10, finished_ttl_s=3600, max_finished=5)  # type: ignore[arg-type]
    opts = CompileOptions()
    made = [jobs.submit("onnx", str(i).encode(), "m", opts) for i in range(20)]
    assert len(jobs.jobs) == 5 and [j.id for j in made[-5:]] == list(jobs.jobs)
    for j in jobs.jobs.values():
        j.finished -= 7200  # an hour and more ago
    jobs.submit("onnx", b"new", "m", opts)
    assert len(jobs.jobs) == 1


def test_pending_jobs_are_bounded(tmp_path: Path) -> None:
    class Slow(_Cached):
        def lookup(self, key: str) -> None:  # type: ignore[override]
            return None

    jobs = JobManager(Slow(tmp_path), 1, 10, max_pending=2)  # type: ignore[arg-type]
    jobs.inflight = {"a": Job("1", "a", "m"), "b": Job("2", "b", "m")}  # two compiling
    with pytest.raises(JobsFull, match="2 compile jobs queued or running"):
        jobs.submit("onnx", b"m", "m", CompileOptions())
