"""KServe v2 HTTP routes. Bad input is a 4xx with `{"error": ...}`; the gateway never 5xxes on it."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.model_spec import ModelSpec, SpecError
from anvil_core.registry import Registry
from anvil_core.tensors import TensorError
from anvil_core.wire import pb
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from anvil_gateway import metrics as m
from anvil_gateway.backend import BackendUnavailable, SchedulerLink
from anvil_gateway.discovery import Discovery
from anvil_gateway.kserve import BadRequest, ParsedRequest, encode_response, parse_json_request
from anvil_gateway.settings import GatewaySettings

__all__ = ["create_app"]

SERVER_NAME = "anvil"
SERVER_VERSION = "0.1.0"
TRACE_HEADER = "x-anvil-trace-id"

_HTTP_STATUS = {
    pb.ErrorCode.BAD_REQUEST: 400,
    pb.ErrorCode.NOT_FOUND: 404,
    pb.ErrorCode.OVERLOAD: 429,
    pb.ErrorCode.UNAVAILABLE: 503,
    pb.ErrorCode.DEADLINE: 504,
    pb.ErrorCode.CANCELLED: 499,
    pb.ErrorCode.PROTOCOL: 502,
    pb.ErrorCode.INTERNAL: 500,
}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class TooLarge(Exception):
    """The body is over the configured limit (413)."""


class NotFound(Exception):
    """Unknown model or version (404)."""


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing (413) as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(settings: GatewaySettings) -> FastAPI:
    registry = Registry(
        settings.redis_url,
        "gateway",
        settings.service_id,
        settings.heartbeat_ttl_s,
        settings.heartbeat_interval_s,
        fields=lambda: {"http_port": settings.http_port, "host": settings.advertise_host},
    )
    link = SchedulerLink(identity=f"gw-{settings.service_id}")
    discovery = Discovery(registry, settings.discovery_interval_ms / 1000, link.follow)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        link.start()
        await registry.start()
        await discovery.start()
        yield
        await discovery.stop()
        await registry.stop()
        await link.stop()

    app = FastAPI(title="Anvil gateway", version=SERVER_VERSION, lifespan=lifespan)
    app.state.discovery = discovery
    app.state.link = link

    @app.exception_handler(StarletteHTTPException)
    async def _http_exc(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()}")

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": []}

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", response_model=None)
    async def ready() -> Response:
        ok, why = await discovery.ready()
        return JSONResponse({"ready": True}) if ok else error(503, f"not ready: {why}")

    def lookup(name: str, version: str | None) -> ModelSpec:
        spec = discovery.models.get(name)
        if spec is None:
            raise NotFound(f"unknown model {name!r}; known: {sorted(discovery.models)}")
        if version is not None and version != spec.version:
            raise NotFound(f"model {name!r} has no version {version!r}; versions: [{spec.version!r}]")
        return spec

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    @app.get("/v2/models/{name}", response_model=None)
    @app.get("/v2/models/{name}/versions/{version}", response_model=None)
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        spec = lookup(name, version)
        return {
            "name": spec.name,
            "versions": [spec.version],
            "platform": spec.platform,
            "inputs": [
                {"name": t.name, "datatype": t.datatype, "shape": t.full_shape(spec.max_batch)}
                for t in spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype, "shape": t.full_shape(spec.max_batch)}
                for t in spec.outputs
            ],
        }

    @app.get("/v2/models/{name}/ready", response_model=None)
    @app.get("/v2/models/{name}/versions/{version}/ready", response_model=None)
    async def model_ready(name: str, version: str | None = None) -> Response:
        lookup(name, version)
        ok, why = await discovery.ready(name)
        return JSONResponse({"name": name, "ready": True}) if ok else error(503, f"not ready: {why}")

    @app.post("/v2/models/{name}/infer", response_model=None)
    @app.post("/v2/models/{name}/versions/{version}/infer", response_model=None)
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        t0 = time.perf_counter()
        trace_id = request.headers.get(TRACE_HEADER) or uuid.uuid4().hex
        hdr = {TRACE_HEADER: trace_id}
        m.inflight.inc()
        try:
            status, doc = await _infer(name, version, request, trace_id)
        finally:
            m.inflight.dec()
        outcome = "success" if status == 200 else "error"
        m.requests.labels(
            model=name if name in discovery.models else "_unknown", outcome=outcome, reason=str(status)
        ).inc()
        if status == 200:
            m.request_us.labels(model=name).observe((time.perf_counter() - t0) * 1e6)
            return JSONResponse(doc, headers=hdr)
        return error(status, doc["error"], headers=hdr)

    async def _infer(
        name: str, version: str | None, request: Request, trace_id: str
    ) -> tuple[int, dict[str, Any]]:
        try:
            body = await read_body(request, settings.max_body_bytes)
        except TooLarge:
            return 413, {"error": f"request body exceeds the limit of {settings.max_body_bytes} bytes"}
        try:
            spec = lookup(name, version)
        except NotFound as exc:
            return 404, {"error": str(exc)}
        try:
            parsed = parse_json_request(body)
            spec.validate(parsed.inputs)
            priority, timeout_s = _qos_params(parsed, settings)
            unknown = [o for o in parsed.outputs if o not in {t.name for t in spec.outputs}]
            if unknown:
                raise BadRequest(f"model {name!r} has no outputs {unknown}")
        except (BadRequest, SpecError, TensorError) as exc:
            return 400, {"error": str(exc)}
        request_id = uuid.uuid4().hex
        payloads: list[Any] = []
        envelope = codec.build_request(
            request_id=request_id,
            trace_id=trace_id,
            model=name,
            version=spec.version,
            priority=priority,
            deadline_unix_ns=time.time_ns() + int(timeout_s * 1e9),
            tenant="default",
            inputs=codec.tensor_frames(parsed.inputs, payloads),
            outputs=parsed.outputs,
        )
        try:
            resp, out_frames = await link.infer(request_id, [envelope, *payloads], timeout_s + 0.05)
        except BackendUnavailable as exc:
            return 503, {"error": f"model {name!r} unavailable: {exc}"}
        except TimeoutError:
            return 504, {"error": f"no answer within the deadline ({timeout_s * 1e3:.0f} ms)"}
        err = resp.Error()
        if err is not None and err.Code() != pb.ErrorCode.OK:
            kind = wire.ERROR_NAMES.get(err.Code(), "ERROR").lower()
            reason = (err.Reason() or b"").decode(errors="replace")
            return _HTTP_STATUS.get(err.Code(), 500), {"error": f"{kind}: {reason}"}
        m.queue_us.labels(model=name).observe(resp.QueueUs())
        m.compute_us.labels(model=name).observe(resp.ComputeUs())
        outputs = [codec.request_tensor(resp.Outputs(j), out_frames) for j in range(resp.OutputsLength())]
        return 200, encode_response(name, spec.version, parsed.id, outputs)

    return app


def _qos_params(parsed: ParsedRequest, settings: GatewaySettings) -> tuple[int, float]:
    """Priority class and the time budget in s: the class SLO, tightened (never loosened) by `timeout` µs."""
    priority = parsed.parameters.get("priority", settings.default_priority)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in (1, 2, 3):
        raise BadRequest("parameters.priority must be 1 (interactive), 2 (standard) or 3 (batch)")
    budget_s = settings.slo_ms(priority) / 1000
    timeout = parsed.parameters.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise BadRequest("parameters.timeout must be a positive integer (µs)")
        budget_s = min(budget_s, timeout / 1e6)
    return priority, budget_s
