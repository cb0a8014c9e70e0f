"""KServe v2 metadata routes: server, health, model metadata/ready/config/stats, and the model
repository (index, load, unload) over the registry's deploy/undeploy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from anvil_core import deployments
from anvil_core.model_spec import ModelSpec
from anvil_core.priorities import PRIORITIES
from anvil_gateway.admission import Rejected
from anvil_gateway.state import SERVER_NAME, SERVER_VERSION, error, state_of

__all__ = ["router"]

router = APIRouter()

EXTENSIONS = [
    "binary_tensor_data",
    "system_shared_memory",
    "statistics",
    "schedule_policy",
    "model_configuration",
    "model_repository",
]


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", response_model=None)
async def ready(request: Request) -> Response:
    state = state_of(request)
    if state.link.died is not None:  # the answers of the scheduler can no longer reach anyone
        return error(503, f"not ready: {state.link.died}")
    ok, why = await state.discovery.ready()
    return JSONResponse({"ready": True}) if ok else error(503, f"not ready: {why}")


def _tensors(spec: ModelSpec, which: str) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "datatype": t.datatype, "shape": t.full_shape(spec.max_batch)}
        for t in getattr(spec, which)
    ]


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    spec = await state_of(request).resolve(name, version)
    return {
        "name": spec.name,
        "versions": [spec.version],
        "platform": spec.platform,
        "inputs": _tensors(spec, "inputs"),
        "outputs": _tensors(spec, "outputs"),
    }


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
    spec = await st.resolve(name, version)

    def cfg(t: Any) -> dict[str, Any]:
        return {
            "name": t.name,
            "data_type": f"TYPE_{'STRING' if t.datatype == 'BYTES' else t.datatype}",
            "dims": list(t.dims),
        }

    s = st.settings
    return {
        "name": spec.name,
        "platform": spec.platform,
        "backend": "anvil",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": spec.max_batch,
        "input": [cfg(t) for t in spec.inputs],
        "output": [cfg(t) for t in spec.outputs],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": 0,
            "priority_levels": 3,
            "default_priority_level": s.default_priority,
            "priority_queue_policy": {
                str(p): {"default_timeout_microseconds": s.slo_ms(p) * 1000} for p in PRIORITIES
            },
        },
        "instance_group": [{"name": spec.name, "kind": "KIND_AUTO", "count": 1}],
    }


@router.get("/v2/models/stats")
async def all_stats(request: Request) -> dict[str, Any]:
    st = state_of(request)
    return st.stats.doc([(m.name, m.version) for m in st.discovery.models.values()])


@router.get("/v2/models/{name}/stats")
@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_stats(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    st = state_of(request)
    spec = await st.resolve(name, version)
    return st.stats.doc([(spec.name, spec.version)])


# ---- KServe v2 model repository extension: the registry's deploy/undeploy (anvil_core.deployments) --
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
    """Every model and version the registry knows with its true state: READY (served), LOADING
    (deployed, no executor serves it yet), UNAVAILABLE (unloaded, or not the served version)."""
    refused = await _repository_caller(request)
    if refused is not None:
        return refused
    try:
        return JSONResponse(await deployments.index(state_of(request).registry.redis))
    except (RedisError, OSError) as exc:
        return error(503, f"registry (redis) unreachable: {exc}")


@router.post("/v2/repository/models/{name}/load", response_model=None)
async def repository_load(request: Request, name: str) -> Response:
    """Serve the model's newest deployed version again (after an unload); the executors that place
    it load it and warm it up. Answers, like Triton, once it serves (200), or 503 after
    ``repository_load_wait_ms`` saying why it does not serve yet."""
    done = await _repository_change(request, name, deployments.load)
    if done.status_code != 200:
        return done
    st = state_of(request)
    deadline = time.monotonic() + st.settings.repository_load_wait_ms / 1000
    while True:
        ok, why = await st.discovery.ready(name)
        if ok:
            await st.discovery.refresh()
            return done
        if time.monotonic() >= deadline:
            return error(503, f"model {name!r} does not serve yet: {why}")
        await asyncio.sleep(0.1)


@router.post("/v2/repository/models/{name}/unload", response_model=None)
async def repository_unload(request: Request, name: str) -> Response:
    """Stop serving the model (its deployed versions stay in the repository for a later load):
    executors unload it, requests queued for it are answered with an error, new ones get 404."""
    return await _repository_change(request, name, deployments.unload)


async def _repository_change(request: Request, name: str, change: Any) -> Response:
    refused = await _repository_caller(request)
    if refused is not None:
        return refused
    try:
        await request.body()  # Triton's clients send parameters here; none change what is done
        done = await change(state_of(request).registry.redis, name)
    except deployments.RepositoryError as exc:
        return error(404, str(exc))
    except (RedisError, OSError) as exc:
        return error(503, f"registry (redis) unreachable: {exc}")
    await state_of(request).discovery.refresh()  # unload: 404 from this gateway at once
    return JSONResponse({"model": name, "result": done})
