"""KServe system shared memory routes (register / status / unregister), off unless allowed.

Every route takes the caller's API key like inference does (`Admission.tenant`: 401 without a
known key when `ANVIL_REQUIRE_API_KEY=1`), and sees only the caller's tenant's regions.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from anvil_gateway import metrics as m
from anvil_gateway.admission import Rejected
from anvil_gateway.kserve import parse_json_document
from anvil_gateway.state import GatewayState, error, state_of
from anvil_gateway.sysshm import ShmError

__all__ = ["router"]

router = APIRouter()
MAX_REGISTER_BODY_BYTES = 4096


def _tenant(st: GatewayState, request: Request) -> str:
    return st.admission.tenant(request.headers)


@router.get("/v2/systemsharedmemory/status", response_model=None)
@router.get("/v2/systemsharedmemory/region/{name}/status", response_model=None)
async def status(request: Request, name: str | None = None) -> Any:
    st = state_of(request)
    try:
        return st.shm.status(_tenant(st, request), name)
    except Rejected as exc:
        return error(exc.status, str(exc))
    except ShmError as exc:
        return error(exc.status, str(exc))


@router.post("/v2/systemsharedmemory/region/{name}/register", response_model=None)
async def register(request: Request, name: str) -> Response:
    st = state_of(request)
    try:
        tenant = _tenant(st, request)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_REGISTER_BODY_BYTES:
            return error(413, f"register body over {MAX_REGISTER_BODY_BYTES} bytes")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_REGISTER_BODY_BYTES:
                return error(413, f"register body over {MAX_REGISTER_BODY_BYTES} bytes")
        doc = parse_json_document(body)
        st.shm.register(tenant, name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))  # type: ignore[arg-type]
    except Rejected as exc:
        return error(exc.status, str(exc))
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
        st.shm.unregister(_tenant(st, request), name)
    except Rejected as exc:
        return error(exc.status, str(exc))
    except ShmError as exc:
        return error(exc.status, str(exc))
    m.shm_regions.set(len(st.shm.regions))
    return JSONResponse({})


# CUDA shared memory (the KServe cudasharedmemory extension) is not offered: nothing can be
# registered, so status is empty and unregister-all succeeds (clients such as perf_analyzer call it
# on exit whatever they used). The API key is checked all the same.
@router.get("/v2/cudasharedmemory/status", response_model=None)
@router.get("/v2/cudasharedmemory/region/{name}/status", response_model=None)
async def cuda_status(request: Request, name: str | None = None) -> Any:
    try:
        _tenant(state_of(request), request)
    except Rejected as exc:
        return error(exc.status, str(exc))
    return []


@router.post("/v2/cudasharedmemory/unregister", response_model=None)
async def cuda_unregister_all(request: Request) -> Any:
    try:
        _tenant(state_of(request), request)
    except Rejected as exc:
        return error(exc.status, str(exc))
    return {}


@router.post("/v2/cudasharedmemory/region/{name}/register", response_model=None)
@router.post("/v2/cudasharedmemory/region/{name}/unregister", response_model=None)
async def cuda_region(request: Request, name: str) -> Response:
    try:
        _tenant(state_of(request), request)
    except Rejected as exc:
        return error(exc.status, str(exc))
    return error(400, "CUDA shared memory is not supported by this server; use system shared memory")
