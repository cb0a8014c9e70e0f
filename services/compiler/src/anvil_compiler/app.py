"""The compiler's HTTP API.

| method | path | what |
|---|---|---|
| GET | /v1/health | liveness, registry connection, artifact dir |
| POST | /v1/compile | multipart ``file`` or ``path``, ``name``, ``format``, ``options`` (JSON) -> job |
| GET | /v1/jobs/{id} | status, stage, percent, artifact id, error (op/node) |
| GET | /v1/artifacts/{id} | the manifest |
| GET | /v1/artifacts/{id}/files/{name} | one file of the artifact (names from the manifest) |

A bad model fails its job (the error names the op/node); the service keeps serving.

Boundaries (docs/security.md): every route but health takes an API key when one is configured
(`compiler_api_key` or the secrets dir's file: on by default under `anvil up` and compose, and the
tenants' keys with `require_api_key`); a server-side `path` is read
only from beneath `model_root` (model_paths.py); an upload is refused from its Content-Length, and
cut off as soon as its stream passes the cap, before anything is buffered past it; the job table is
bounded (jobs.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.types import Message

from anvil_compiler.cache import ArtifactCache
from anvil_compiler.errors import CompileError
from anvil_compiler.jobs import JobManager, JobsFull
from anvil_compiler.model_paths import PathRefused, read_model
from anvil_compiler.options import CompileOptions
from anvil_compiler.settings import CompilerSettings
from anvil_core import keys
from anvil_core.registry import Registry

__all__ = ["create_app"]

FORM_OVERHEAD_BYTES = 1 << 20  # multipart boundaries, part headers, the small fields


class _TooLarge(Exception):
    pass


def _read_path(settings: CompilerSettings, path: str, fmt: str) -> bytes:
    try:
        return read_model(settings.model_root_path, path, fmt, settings.max_model_bytes)
    except PathRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None


def _presented_key(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")


async def _form(request: Request, cap: int) -> Any:
    """The multipart form, its stream cut off (413) as soon as it passes `cap` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise HTTPException(413, f"request body of {declared} bytes exceeds the cap of {cap} bytes")
    seen = 0

    async def receive() -> Message:
        nonlocal seen
        msg = await request.receive()
        seen += len(msg.get("body", b""))
        if seen > cap:
            raise _TooLarge
        return msg

    try:
        return await Request(request.scope, receive).form(max_files=2, max_fields=8)
    except _TooLarge:
        raise HTTPException(413, f"request body exceeds the cap of {cap} bytes (cut off)") from None


async def _upload(form: Any, field: str, cap: int, what: str) -> bytes | None:
    item = form.get(field)
    if item is None or isinstance(item, str):
        return None
    assert isinstance(item, UploadFile)
    data = await item.read(cap + 1)
    if len(data) > cap:
        raise HTTPException(413, f"{what} larger than max_model_mib={cap >> 20}")
    return data


def create_app(settings: CompilerSettings) -> FastAPI:
    artifacts = Path(settings.artifact_dir)
    registry = Registry(
        settings.redis_url,
        "compiler",
        settings.service_id,
        settings.heartbeat_ttl_s,
        settings.heartbeat_interval_s,
        fields=lambda: {"http_port": settings.http_port, "host": settings.advertise_host},
        auth=settings.redis_auth,
    )
    cache = ArtifactCache(settings.redis_url, artifacts, settings.redis_auth)
    jobs = JobManager(
        cache,
        settings.max_concurrent_jobs,
        settings.job_timeout_s,
        settings.finished_job_ttl_s,
        settings.max_finished_jobs,
        settings.max_pending_jobs,
    )
    api_key = settings.api_key()
    auth_on = bool(api_key) or settings.require_api_key

    def _tenant_key(key: str) -> bool:
        try:
            return bool(cache.r.hexists(keys.tenants_key(), hashlib.sha256(key.encode()).hexdigest()))
        except redis.RedisError:
            raise HTTPException(503, "the API key cannot be checked: registry unreachable") from None

    async def authorized(request: Request) -> None:
        """401 unless the request carries an accepted key (when keys are configured)."""
        if not auth_on:
            return
        key = _presented_key(request)
        if key and api_key and hmac.compare_digest(key, api_key):
            return
        if key and settings.require_api_key and await run_in_threadpool(_tenant_key, key):
            return
        raise HTTPException(
            401,
            "an API key is required (Authorization: Bearer <key> or x-api-key)"
            if not key
            else "unknown API key",
        )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        artifacts.mkdir(parents=True, exist_ok=True)
        settings.model_root_path.mkdir(mode=0o700, parents=True, exist_ok=True)
        await registry.start()
        yield
        await registry.stop()

    app = FastAPI(title="Anvil compiler", version="0.1.0", lifespan=lifespan)
    app.state.jobs = jobs

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"live": True, "registry": registry.connected, "artifact_dir_writable": artifacts.is_dir()}

    @app.post("/v1/compile", dependencies=[Depends(authorized)])
    async def compile_(request: Request) -> dict[str, Any]:
        """multipart: `file` or `path`, `name`, `format`, `options` (JSON), optional `calibration`."""
        cap = settings.max_model_bytes
        form = await _form(request, 2 * cap + FORM_OVERHEAD_BYTES)
        try:
            fields = {k: form.get(k) for k in ("path", "name", "format", "options")}
            if any(v is not None and not isinstance(v, str) for v in fields.values()):
                raise HTTPException(400, "path, name, format and options must be form fields, not files")
            path, name = fields["path"] or "", fields["name"] or "model"
            fmt, options = fields["format"] or "", fields["options"] or "{}"
            fmt = fmt or ("hf" if (path and (settings.model_root_path / path).is_dir()) else "onnx")
            if fmt not in ("onnx", "hf"):
                raise HTTPException(400, f"format must be onnx or hf, got {fmt!r}")
            try:
                opts = CompileOptions.from_dict(json.loads(options))
            except (CompileError, json.JSONDecodeError) as exc:
                raise HTTPException(400, f"bad options: {exc}") from exc
            data = await _upload(form, "file", cap, "model")
            if data is None and path:
                data = await run_in_threadpool(_read_path, settings, path, fmt)
            elif data is None:
                raise HTTPException(400, "send the model as `file` or name a server-side `path`")
            calib = await _upload(form, "calibration", cap, "calibration data") or b""
        finally:
            await form.close()
        try:
            job = await run_in_threadpool(jobs.submit, fmt, data, name, opts, calib)
        except JobsFull as exc:
            raise HTTPException(429, str(exc), headers={"Retry-After": "5"}) from None
        return job.to_dict()

    @app.get("/v1/jobs/{job_id}", dependencies=[Depends(authorized)])
    async def job(job_id: str) -> dict[str, Any]:
        j = jobs.jobs.get(job_id)
        if j is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return j.to_dict()

    @app.get("/v1/artifacts/{artifact_id}", dependencies=[Depends(authorized)])
    async def artifact(artifact_id: str) -> dict[str, Any]:
        manifest = await run_in_threadpool(cache.lookup, artifact_id) if artifact_id.isalnum() else None
        if manifest is None:
            raise HTTPException(404, f"no artifact {artifact_id!r}")
        return manifest

    @app.get("/v1/artifacts/{artifact_id}/files/{name}", dependencies=[Depends(authorized)])
    async def artifact_file(artifact_id: str, name: str) -> FileResponse:
        manifest = await run_in_threadpool(cache.lookup, artifact_id) if artifact_id.isalnum() else None
        if manifest is None or name not in manifest["files"]:
            raise HTTPException(404, f"artifact {artifact_id!r} has no file {name!r}")
        return FileResponse(cache.path(artifact_id) / name, filename=name)

    return app
