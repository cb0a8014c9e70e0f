"""KServe v2 metadata routes: server, health, model metadata/ready/config/stats, and the model
repository (index, load, unload) over the registry's deploy/undeploy (repository.py). The documents
are built in model_docs.py, shared with the gRPC front end."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from anvil_gateway import model_docs, repository
from anvil_gateway.admission import Rejected
from anvil_gateway.request_path import Failed
from anvil_gateway.state import error, state_of

__all__ = ["router"]

router = APIRouter()


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return model_docs.server_metadata()


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", response_model=None)
async def ready(request: Request) -> Response:
    ok, why = await model_docs.server_ready(state_of(request))
    return JSONResponse({"ready": True}) if ok else error(503, f"not ready: {why}")


# before /v2/models/{name}: routes match in order, and "stats" would be taken for a model name
@router.get("/v2/models/stats")
async def all_stats(request: Request) -> dict[str, Any]:
    st = state_of(request)
    return await model_docs.statistics(st, list(st.discovery.models.values()))


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    return model_docs.model_metadata(await state_of(request).resolve(name, version))


@router.get("/v2/models/{name}/ready", response_model=None)
@router.get("/v2/models/{name}/versions/{version}/ready", response_model=None)
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    st = state_of(request)
    await st.resolve(name, version)
    ok, why = await st.discovery.ready(name)
    return JSONResponse({"name": name, "ready": True}) if ok else error(503, f"not ready: {why}")


@router.get("/v2/models/{name}/config")
@router.get("/v2/models/{name}/versions/{version}/config")
async def model_config(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration shape (perf_analyzer reads max_batch_size and the tensors)."""
    st = state_of(request)
    return model_docs.model_config(await st.resolve(name, version), st.settings)


@router.get("/v2/models/{name}/stats")
@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_stats(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    st = state_of(request)
    return await model_docs.statistics(st, [await st.resolve(name, version)])


# ---- KServe v2 model repository extension: the registry's deploy/undeploy (repository.py) ----------
async def _repository_caller(request: Request) -> Response | None:
    """The repository routes change what every client is served: the API key is checked as on
    the inference routes (401 when ANVIL_REQUIRE_API_KEY=1 and the key is missing or unknown)."""
    try:
        state_of(request).admission.tenant(request.headers)
    except Rejected as exc:
        return error(exc.status, str(exc))
    return None


@router.post("/v2/repository/index", response_model=None)
async def repository_index(request: Request) -> Response:
    """Every model and version the registry knows with its true state (repository.index)."""
    refused = await _repository_caller(request)
    if refused is not None:
        return refused
    try:
        return JSONResponse(await repository.index(state_of(request)))
    except Failed as exc:
        return error(exc.status, str(exc))


@router.post("/v2/repository/models/{name}/load", response_model=None)
async def repository_load(request: Request, name: str) -> Response:
    """Serve the model's newest deployed version again; answers, like Triton, once it serves (200),
    or 503 after ``repository_load_wait_ms`` saying why it does not serve yet (repository.load)."""
    return await _repository_change(request, name, repository.load)


@router.post("/v2/repository/models/{name}/unload", response_model=None)
async def repository_unload(request: Request, name: str) -> Response:
    """Stop serving the model; its deployed versions stay for a later load (repository.unload)."""
    return await _repository_change(request, name, repository.unload)


async def _repository_change(request: Request, name: str, change: Any) -> Response:
    refused = await _repository_caller(request)
    if refused is not None:
        return refused
    try:
        await request.body()  # Triton's clients send parameters here; none change what is done
        done = await change(state_of(request), name)
    except Failed as exc:
        return error(exc.status, str(exc))
    return JSONResponse({"model": name, "result": done})
