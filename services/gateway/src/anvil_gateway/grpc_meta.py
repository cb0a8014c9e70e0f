"""The gRPC calls besides inference: health, metadata, configuration, statistics, the model repository
and system shared memory. Each calls what its HTTP route calls (model_docs.py, stats.py,
repository.py, sysshm.py) with the same tenant rules, and turns the result into protobuf: the JSON
documents are Triton's JSON form of these messages, so `json_format.ParseDict` fills them in.
Each raises `Failed` (the HTTP status) for grpc_server.py to answer as a gRPC status.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format

from anvil_core.model_spec import ModelSpec
from anvil_gateway import metrics as m
from anvil_gateway import model_docs, repository
from anvil_gateway.admission import Rejected
from anvil_gateway.proto_gen import grpc_service_pb2 as pb
from anvil_gateway.request_path import Failed
from anvil_gateway.state import GatewayState, NotFound
from anvil_gateway.sysshm import ShmError

__all__ = [
    "CUDA_SHM_UNSUPPORTED",
    "SHM_REGISTER_CODES",
    "SHM_UNREGISTER_CODES",
    "cuda_shm_register",
    "cuda_shm_status",
    "cuda_shm_unregister",
    "model_config",
    "model_metadata",
    "model_ready",
    "model_statistics",
    "repository_index",
    "repository_load",
    "repository_unload",
    "server_metadata",
    "server_ready",
    "shm_register",
    "shm_status",
    "shm_unregister",
    "tenant",
]

CUDA_SHM_UNSUPPORTED = "CUDA shared memory is not supported by this server; use system shared memory"
# 409 from sysshm: the name is taken (register) / the region is in use (unregister); 429: too many regions
SHM_REGISTER_CODES = {409: grpc.StatusCode.ALREADY_EXISTS, 429: grpc.StatusCode.RESOURCE_EXHAUSTED}
SHM_UNREGISTER_CODES = {409: grpc.StatusCode.FAILED_PRECONDITION}


def tenant(st: GatewayState, md: Any) -> str:
    """The caller's tenant from its metadata (`authorization: Bearer <key>` or `x-api-key`), as
    HTTP reads headers: Failed(401) without a known key when ANVIL_REQUIRE_API_KEY=1."""
    try:
        return st.admission.tenant(md)
    except Rejected as exc:
        raise Failed(exc.status, str(exc), exc.reason) from None


async def _resolve(st: GatewayState, name: str, version: str) -> ModelSpec:
    try:
        return await st.resolve(name, version or None)
    except NotFound as exc:
        raise Failed(404, str(exc), "not_found") from None


async def server_ready(st: GatewayState) -> pb.ServerReadyResponse:
    ok, _ = await model_docs.server_ready(st)
    return pb.ServerReadyResponse(ready=ok)


async def model_ready(st: GatewayState, req: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
    """Unknown model: NOT_FOUND (HTTP 404); known but not served yet: ready=false (HTTP 503)."""
    await _resolve(st, req.name, req.version)
    ok, _ = await st.discovery.ready(req.name)
    return pb.ModelReadyResponse(ready=ok)


def server_metadata() -> pb.ServerMetadataResponse:
    return json_format.ParseDict(model_docs.server_metadata(), pb.ServerMetadataResponse())


async def model_metadata(st: GatewayState, req: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
    spec = await _resolve(st, req.name, req.version)
    return json_format.ParseDict(model_docs.model_metadata(spec), pb.ModelMetadataResponse())


async def model_config(st: GatewayState, req: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
    spec = await _resolve(st, req.name, req.version)
    doc = {"config": model_docs.model_config(spec, st.settings)}
    return json_format.ParseDict(doc, pb.ModelConfigResponse())


async def model_statistics(st: GatewayState, req: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
    """What GET /v2/models[/{m}]/stats answers (model_docs.statistics); an empty name: every model.
    Fields a later stats.py adds that this protocol lacks are left out, not an error."""
    if req.name:
        specs = [await _resolve(st, req.name, req.version)]
    else:
        specs = list(st.discovery.models.values())
    doc = await model_docs.statistics(st, specs)
    return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)


# ---- model repository (repository.py: the registry's deploy/undeploy, as HTTP) ------------------
async def repository_index(
    st: GatewayState, req: pb.RepositoryIndexRequest, md: Any
) -> pb.RepositoryIndexResponse:
    tenant(st, md)
    models = await repository.index(st)
    if req.ready:
        models = [e for e in models if e.get("state") == "READY"]
    return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True)


async def repository_load(
    st: GatewayState, req: pb.RepositoryModelLoadRequest, md: Any
) -> pb.RepositoryModelLoadResponse:
    """Answers once the model serves, as Triton's does (HTTP's load route: repository.load)."""
    tenant(st, md)
    await repository.load(st, req.model_name)
    return pb.RepositoryModelLoadResponse()


async def repository_unload(
    st: GatewayState, req: pb.RepositoryModelUnloadRequest, md: Any
) -> pb.RepositoryModelUnloadResponse:
    tenant(st, md)
    await repository.unload(st, req.model_name)
    return pb.RepositoryModelUnloadResponse()


# ---- system shared memory (sysshm.py: per tenant, as HTTP) ----------------------------------------
def _shm(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ShmError as exc:
        raise Failed(exc.status, str(exc), "shm") from None


def shm_status(
    st: GatewayState, req: pb.SystemSharedMemoryStatusRequest, md: Any
) -> pb.SystemSharedMemoryStatusResponse:
    regions = _shm(st.shm.status, tenant(st, md), req.name or None)
    resp = pb.SystemSharedMemoryStatusResponse()
    for r in regions:
        resp.regions[r["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**r))
    return resp


def shm_register(
    st: GatewayState, req: pb.SystemSharedMemoryRegisterRequest, md: Any
) -> pb.SystemSharedMemoryRegisterResponse:
    _shm(st.shm.register, tenant(st, md), req.name, req.key, req.offset, req.byte_size)
    m.shm_regions.set(len(st.shm.regions))
    return pb.SystemSharedMemoryRegisterResponse()


def shm_unregister(
    st: GatewayState, req: pb.SystemSharedMemoryUnregisterRequest, md: Any
) -> pb.SystemSharedMemoryUnregisterResponse:
    _shm(st.shm.unregister, tenant(st, md), req.name or None)
    m.shm_regions.set(len(st.shm.regions))
    return pb.SystemSharedMemoryUnregisterResponse()


# CUDA shared memory is not offered: register (and unregistering a named region) is UNIMPLEMENTED;
# status is empty and unregister-all succeeds, as over HTTP, because clients such as perf_analyzer
# call them on exit whatever memory they used. The API key is checked all the same.
def cuda_shm_status(st: GatewayState, req: Any, md: Any) -> pb.CudaSharedMemoryStatusResponse:
    tenant(st, md)
    return pb.CudaSharedMemoryStatusResponse()


def cuda_shm_register(st: GatewayState, req: Any, md: Any) -> pb.CudaSharedMemoryRegisterResponse:
    tenant(st, md)
    raise Failed(501, CUDA_SHM_UNSUPPORTED, "unsupported")


def cuda_shm_unregister(st: GatewayState, req: Any, md: Any) -> pb.CudaSharedMemoryUnregisterResponse:
    tenant(st, md)
    if req.name:
        raise Failed(501, CUDA_SHM_UNSUPPORTED, "unsupported")
    return pb.CudaSharedMemoryUnregisterResponse()
