"""The gateway's FastAPI application: state, lifespan, error handlers, routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from anvil_core.registry import Registry
from anvil_core.zmq_sockets import link_endpoint
from anvil_gateway import embeddings, infer, routes_meta, routes_shm
from anvil_gateway.admission import Admission
from anvil_gateway.backend import SchedulerLink, UnixSchedulerLink
from anvil_gateway.discovery import Discovery
from anvil_gateway.grpc_server import GrpcFront
from anvil_gateway.peer_stats import publish
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.state import SERVER_VERSION, GatewayState, NotFound, error
from anvil_gateway.stats import Stats
from anvil_gateway.sysshm import SystemShm
from anvil_gateway.zerocopy_server import ZeroCopyServer

__all__ = ["create_app"]


def create_app(settings: GatewaySettings, shared_ports: bool = False) -> FastAPI:
    """The gateway's app; `shared_ports`: one of several worker processes serving the same ports
    (the gRPC port is then bound with SO_REUSEPORT, as workers.py binds the HTTP one)."""
    zerocopy: ZeroCopyServer  # made below (it needs the state); the registry beat reads its endpoint
    stats = Stats()  # the registry beat publishes it (peer_stats.py)
    registry = Registry(
        settings.redis_url,
        "gateway",
        settings.service_id,
        settings.heartbeat_ttl_s,
        settings.heartbeat_interval_s,
        fields=lambda: {
            "http_port": settings.http_port,
            "grpc_port": settings.grpc_port,
            "host": settings.advertise_host,
            "zerocopy_endpoint": zerocopy.endpoint,
        },
        # this process's statistics, which the other gateways add to their answers (peer_stats.py)
        on_beat=lambda redis: publish(redis, stats, settings.service_id, settings.heartbeat_ttl_s),
        auth=settings.redis_auth,
    )
    link = (
        UnixSchedulerLink(
            identity=f"gw-{settings.service_id}",
            bundle_max=settings.bundle_max,
            direct=settings.direct_requests,
            direct_max_rows=settings.direct_max_rows,
        )
        if settings.link_ipc_dir and settings.link_transport == "unix"
        else SchedulerLink(
            identity=f"gw-{settings.service_id}",
            bundle_max=settings.bundle_max,
            curve=settings.curve_client("gateway"),
        )
    )
    shed_ms = {2: settings.shed_delay_ms_p2, 3: settings.shed_delay_ms_p3}
    admission = Admission(settings.require_api_key, settings.max_inflight_per_model, shed_ms)
    discovery = Discovery(
        registry,
        settings.discovery_interval_ms / 1000,
        lambda advertised: link.follow(
            link_endpoint(settings.link_ipc_dir, advertised, "gateway", settings.link_transport)
        ),
        admission.load,
    )
    st = GatewayState(
        settings,
        registry,
        link,
        discovery,
        SystemShm(
            settings.allow_client_shm,
            client_uid=settings.shm_client_uid,
            allow_group=settings.shm_allow_group,
        ),
        admission,
        stats,
        ThreadPoolExecutor(settings.parse_threads, thread_name_prefix="anvil-parse"),
        asyncio.Semaphore(settings.parse_threads),
    )
    stats.known = lambda name, version: getattr(discovery.models.get(name), "version", None) == version
    link.on_executed = stats.executed  # every answer: each batch is counted by one gateway
    zerocopy = ZeroCopyServer(st, settings.zerocopy_dir)
    grpc_front = GrpcFront(st, shared_port=shared_ports)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        link.start()
        await zerocopy.start()
        await registry.start()
        await discovery.start()
        await grpc_front.start()
        yield
        await grpc_front.stop()
        await discovery.stop()
        await zerocopy.stop()  # before the registry: it uses the registry's Redis client
        await registry.stop()
        await link.stop()
        st.parse_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="Anvil gateway", version=SERVER_VERSION, lifespan=lifespan)
    app.state.gw = st
    app.state.discovery = discovery
    app.state.link = link
    app.state.grpc = grpc_front

    @app.exception_handler(StarletteHTTPException)
    async def _http_exc(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()}")

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    app.include_router(routes_meta.router)
    app.include_router(routes_shm.router)
    app.include_router(infer.router)
    app.include_router(embeddings.router)
    return app
