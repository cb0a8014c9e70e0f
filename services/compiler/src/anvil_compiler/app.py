"""The compiler's HTTP API.

| method | path | what |
|---|---|---|
| GET | /v1/health | liveness, registry connection, artifact dir |
| POST | /v1/compile | multipart ``file`` or ``path``, ``name``, ``format``, ``options`` (JSON) -> job |
| GET | /v1/jobs/{id} | status, stage, percent, artifact id, error (op/node) |
| GET | /v1/artifacts/{id} | the manifest |
| GET | /v1/artifacts/{id}/files/{name} | one file of the artifact (names from the manifest) |

A bad model fails its job (the error names the op/node); the service keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, File, Form, HTTPException, UploadFile
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from anvil_compiler.cache import ArtifactCache
from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.jobs import JobManager
from anvil_compiler.options import CompileOptions
from anvil_compiler.settings import CompilerSettings
from anvil_core.registry import Registry

__all__ = ["create_app"]


def _read_path(settings: CompilerSettings, path: str, fmt: str) -> bytes:
    p = Path(path).resolve()
    root = Path(settings.model_root).resolve() if settings.model_root else None
    if root is None or not p.is_relative_to(root):
        raise HTTPException(400, f"path {path!r} is not under the compiler's model_root")
    if fmt == "hf" and p.is_dir():
        return bundle_from_dir(p)
    if not p.is_file():
        raise HTTPException(400, f"path {path!r} is not a readable file")
    return p.read_bytes()


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
    jobs = JobManager(cache, settings.max_concurrent_jobs, settings.job_timeout_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        artifacts.mkdir(parents=True, exist_ok=True)
        await registry.start()
        yield
        await registry.stop()

    app = FastAPI(title="Anvil compiler", version="0.1.0", lifespan=lifespan)
    app.state.jobs = jobs

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"live": True, "registry": registry.connected, "artifact_dir_writable": artifacts.is_dir()}

    @app.post("/v1/compile")
    async def compile_(
        file: UploadFile | None = File(None),  # noqa: B008 (FastAPI's idiom)
        calibration: UploadFile | None = File(None),  # noqa: B008 (.npz: inputs for the accuracy report)
        path: str = Form(""),
        name: str = Form("model"),
        format: str = Form(""),
        options: str = Form("{}"),
    ) -> dict[str, Any]:
        fmt = format or ("hf" if (path and Path(path).is_dir()) else "onnx")
        if fmt not in ("onnx", "hf"):
            raise HTTPException(400, f"format must be onnx or hf, got {fmt!r}")
        try:
            opts = CompileOptions.from_dict(json.loads(options))
        except (CompileError, json.JSONDecodeError) as exc:
            raise HTTPException(400, f"bad options: {exc}") from exc
        if file is not None:
            data = await file.read(settings.max_model_mib * 2**20 + 1)
            if len(data) > settings.max_model_mib * 2**20:
                raise HTTPException(413, f"model larger than max_model_mib={settings.max_model_mib}")
        elif path:
            data = await run_in_threadpool(_read_path, settings, path, fmt)
        else:
            raise HTTPException(400, "send the model as `file` or name a server-side `path`")
        calib = b""
        if calibration is not None:
            calib = await calibration.read(settings.max_model_mib * 2**20 + 1)
            if len(calib) > settings.max_model_mib * 2**20:
                raise HTTPException(
                    413, f"calibration data larger than max_model_mib={settings.max_model_mib}"
                )
        job = await run_in_threadpool(jobs.submit, fmt, data, name, opts, calib)
        return job.to_dict()

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str) -> dict[str, Any]:
        j = jobs.jobs.get(job_id)
        if j is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return j.to_dict()

    @app.get("/v1/artifacts/{artifact_id}")
    async def artifact(artifact_id: str) -> dict[str, Any]:
        manifest = await run_in_threadpool(cache.lookup, artifact_id) if artifact_id.isalnum() else None
        if manifest is None:
            raise HTTPException(404, f"no artifact {artifact_id!r}")
        return manifest

    @app.get("/v1/artifacts/{artifact_id}/files/{name}")
    async def artifact_file(artifact_id: str, name: str) -> FileResponse:
        manifest = await run_in_threadpool(cache.lookup, artifact_id) if artifact_id.isalnum() else None
        if manifest is None or name not in manifest["files"]:
            raise HTTPException(404, f"artifact {artifact_id!r} has no file {name!r}")
        return FileResponse(cache.path(artifact_id) / name, filename=name)

    return app
