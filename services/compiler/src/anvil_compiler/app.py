"""The compiler's HTTP API. The foundation serves health and the artifact-store status; the compile
pipeline (ONNX / safetensors -> fused INT4 plan) lands with its own issue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from anvil_core.registry import Registry
from fastapi import FastAPI

from anvil_compiler.settings import CompilerSettings

__all__ = ["create_app"]


def create_app(settings: CompilerSettings) -> FastAPI:
    artifacts = Path(settings.artifact_dir)
    registry = Registry(
        settings.redis_url,
        "compiler",
        settings.service_id,
        settings.heartbeat_ttl_s,
        settings.heartbeat_interval_s,
        fields=lambda: {"http_port": settings.http_port, "host": settings.advertise_host},
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        artifacts.mkdir(parents=True, exist_ok=True)
        await registry.start()
        yield
        await registry.stop()

    app = FastAPI(title="Anvil compiler", version="0.1.0", lifespan=lifespan)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"live": True, "registry": registry.connected, "artifact_dir_writable": artifacts.is_dir()}

    return app
