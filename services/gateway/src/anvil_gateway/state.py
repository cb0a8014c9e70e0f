"""Everything a gateway process holds, created once by `create_app` and shared by the routes."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse

from anvil_core.model_spec import ModelSpec
from anvil_core.registry import Registry
from anvil_gateway.admission import Admission
from anvil_gateway.backend import SchedulerLink
from anvil_gateway.discovery import Discovery
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.stats import Stats
from anvil_gateway.sysshm import SystemShm

__all__ = ["GatewayState", "NotFound", "error", "state_of"]

SERVER_NAME = "anvil"
SERVER_VERSION = "0.1.0"


class NotFound(Exception):
    """Unknown model or version (404)."""


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


@dataclass
class GatewayState:
    settings: GatewaySettings
    registry: Registry
    link: SchedulerLink
    discovery: Discovery
    shm: SystemShm
    admission: Admission
    stats: Stats
    # Large gRPC and embeddings bodies are parsed here, off the event loop (grpc_infer.py, embeddings.py).
    parse_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="anvil-parse")
    )
    # Large HTTP JSON bodies parsed at once, in steps on the loop (infer.py): bounds their memory.
    parse_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))

    async def resolve(self, name: str, version: str | None) -> ModelSpec:
        """``lookup``, after asking the registry at once about a model the snapshot lacks."""
        if name not in self.discovery.models:
            await self.discovery.learn(name)
        return self.lookup(name, version)

    def lookup(self, name: str, version: str | None) -> ModelSpec:
        spec = self.discovery.models.get(name)
        if spec is None:
            raise NotFound(f"unknown model {name!r}; known: {sorted(self.discovery.models)}")
        if version is not None and version != spec.version:
            raise NotFound(f"model {name!r} has no version {version!r}; versions: [{spec.version!r}]")
        return spec


def state_of(request: Request) -> GatewayState:
    st: GatewayState = request.app.state.gw
    return st
