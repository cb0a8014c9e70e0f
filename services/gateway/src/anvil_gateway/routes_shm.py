"""KServe system shared memory routes (register / status / unregister), off unless allowed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from anvil_gateway import metrics as m
from anvil_gateway.kserve import parse_json_document
from anvil_gateway.state import error, state_of
from anvil_gateway.sysshm import ShmError

__all__ = ["router"]

router = APIRouter()


@router.get("/v2/systemsharedmemory/status", response_model=None)
@router.get("/v2/systemsharedmemory/region/{name}/status", response_model=None)
async def status(request: Request, name: str | None = None) -> Any:
    try:
        return state_of(request).shm.status(name)
    except ShmError as exc:
        return error(exc.status, str(exc))


@router.post("/v2/systemsharedmemory/region/{name}/register", response_model=None)
async def register(request: Request, name: str) -> Response:
    st = state_of(request)
    try:
        body = await request.body()
        if len(body) > 4096:
            return error(413, "register body over 4096 bytes")
        doc = parse_json_document(body)
        st.shm.register(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))  # type: ignore[arg-type]
    except ShmError as exc:
        return error(exc.status, str(exc))
    except ValueError as exc:
        return error(400, str(exc))
    m.shm_regions.set(len(st.shm.regions))
    return JSONResponse({})


@router.post("/v2/systemsharedmemory/unregister", response_model=None)
@router.post("/v2/systemsharedmemory/region/{name}/unregister", response_model=None)
async def unregister(request: Request, name: str | None = None) -> Response:
    st = state_of(request)
    try:
        st.shm.unregister(name)
    except ShmError as exc:
        return error(exc.status, str(exc))
    m.shm_regions.set(len(st.shm.regions))
    return JSONResponse({})


# CUDA shared memory (the KServe cudasharedmemory extension) is not offered: nothing can be
# registered, so status is empty and unregister-all succeeds (clients such as perf_analyzer call it
# on exit whatever they used).
@router.get("/v2/cudasharedmemory/status")
@router.get("/v2/cudasharedmemory/region/{name}/status")
async def cuda_status(name: str | None = None) -> list[dict[str, Any]]:
    return []


@router.post("/v2/cudasharedmemory/unregister")
async def cuda_unregister_all() -> dict[str, Any]:
    return {}


@router.post("/v2/cudasharedmemory/region/{name}/register", response_model=None)
@router.post("/v2/cudasharedmemory/region/{name}/unregister", response_model=None)
async def cuda_region(name: str) -> Response:
    return error(400, "CUDA shared memory is not supported by this server; use system shared memory")
