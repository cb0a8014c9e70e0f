"""POST /v2/models/{m}/infer: read and parse the body, then the shared request path (request_path.py:
validate, admit, forward to the scheduler), and encode the answer as KServe v2 JSON / binary.

Bad input is a 4xx with `{"error": ...}` stating the constraint; the gateway never 5xxes on it.
"""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from anvil_core import tracing
from anvil_core.tensors import HostTensor
from anvil_gateway import metrics as m
from anvil_gateway import spans
from anvil_gateway.admission import Rejected
from anvil_gateway.body_limits import model_body_limit
from anvil_gateway.hops import HOPS_HEADER
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import (
    ParsedRequest,
    answer_cost,
    json_document_steps,
    parse_cost,
    parse_request,
    release_all,
    split_body,
)
from anvil_gateway.request_path import (
    TRACE_HEADER,
    Failed,
    InferCall,
    execute,
    forward,
    note_failure,
    parse_off_loop,
    qos_params,
    run_steps,
    trace_id,
)
from anvil_gateway.responses import HEADER_LENGTH, infer_response
from anvil_gateway.state import GatewayState, NotFound, error, state_of
from anvil_gateway.sysshm import ShmError

__all__ = [
    "TRACE_HEADER",
    "Failed",
    "forward",
    "handle_infer",
    "parse_off_loop",
    "qos_params",
    "read_body",
    "router",
    "trace_id",
]

router = APIRouter()
JSON_BYTES_PER_NUMBER = 20  # the JSON text of an output number, about: large answers encode off the loop


async def read_body(
    request: Request, limit: int, why: str = "the server's max_body_bytes", large: int = 64 << 10
) -> bytes | bytearray:
    """Read the body, refusing (413) before reading when Content-Length exceeds `limit` bytes, and
    as soon as a body without one (chunked) does; `why` names where the limit comes from.

    A body of `large` bytes or more is gathered into one bytearray as it arrives (sized from
    Content-Length when given): joining tens of MB at the end is one long copy on the event loop.
    """
    declared = request.headers.get("content-length")
    too_big = Failed(413, f"request body exceeds the limit of {limit} bytes ({why})", "too_large")
    size_hint = int(declared) if declared is not None and declared.isdigit() else -1
    if size_hint > limit:
        raise too_big
    chunks: list[bytes] = []
    buf: bytearray | None = None
    size = 0
    try:
        async for chunk in request.stream():
            if size + len(chunk) > limit:
                raise too_big
            if buf is None and size + len(chunk) >= large:
                buf = bytearray(max(size_hint, size + len(chunk)))  # zero pages: faulted in as filled
                buf[:size] = b"".join(chunks)
                chunks = []
            if buf is not None:
                buf[size : size + len(chunk)] = chunk  # grows the array if the hint was short
            else:
                chunks.append(chunk)
            size += len(chunk)
    except ClientDisconnect:  # the client hung up mid-body: nobody to answer, nothing to log loudly
        raise Failed(499, "client disconnected before sending the whole body", "client_disconnect") from None
    if buf is None:
        return b"".join(chunks)
    del buf[size:]  # a Content-Length larger than what came
    return buf


@router.post("/v2/models/{name}/infer", response_model=None)
@router.post("/v2/models/{name}/versions/{version}/infer", response_model=None)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """KServe v2 inference (JSON, binary tensor extension, system shared memory)."""
    return await handle_infer(state_of(request), request, name, version)


async def handle_infer(st: GatewayState, request: Request, name: str, version: str | None) -> Response:
    """The infer pipeline; also called by the ASGI fast path (fastpath.py) with the same result."""
    if tracing.ON:  # the root span (spans.py); off: not even a no-op context
        return await spans.server("gateway.infer", request, name, lambda: _handle(st, request, name, version))
    return await _handle(st, request, name, version)


async def _handle(st: GatewayState, request: Request, name: str, version: str | None) -> Response:
    t0 = time.perf_counter_ns()
    hdr = {TRACE_HEADER: trace_id(request.headers)}
    m.inflight.inc()
    try:
        return await _infer(st, request, name, version, hdr, t0)
    except Failed as exc:
        note_failure(st, name, version, exc, t0)
        return error(exc.status, str(exc), headers={**hdr, **exc.headers})
    finally:
        m.inflight.dec()


async def _infer(
    st: GatewayState, request: Request, name: str, version: str | None, hdr: dict[str, str], t0: int
) -> Response:
    try:
        tenant = st.admission.tenant(request.headers)
    except Rejected as exc:
        raise Failed(exc.status, str(exc), exc.reason) from None
    try:
        spec = await st.resolve(name, version)
    except NotFound as exc:
        raise Failed(404, str(exc), "not_found") from None
    limit, why = model_body_limit(spec, st.settings.max_body_bytes)
    body = await read_body(request, limit, why, st.settings.parse_offload_bytes)
    shm = st.shm if st.shm.enabled else None
    header_length = request.headers.get(HEADER_LENGTH)
    try:
        with tracing.span("gateway.parse"):
            doc = None
            if parse_cost(len(body), header_length) >= st.settings.parse_offload_bytes:
                # much JSON: parsed in ~0.25 ms steps on the loop, other requests served between them
                async with st.parse_slots:
                    head, _ = split_body(body, header_length)
                    doc = await run_steps(json_document_steps(head))
            parsed = parse_request(body, header_length, shm, tenant, doc=doc)
    except ShmError as exc:
        raise Failed(exc.status, str(exc), "shm") from None
    except BadRequest as exc:
        raise Failed(400, str(exc), "bad_request") from None
    call = InferCall(spec, parsed, tenant, hdr[TRACE_HEADER], t0, version)
    try:
        cost = partial(answer_cost, parsed, json_bytes_per_number=JSON_BYTES_PER_NUMBER)
        return await execute(st, call, partial(_answer, spec.name, parsed, st, hdr), cost)
    finally:
        release_all(parsed, shm)


def _answer(
    name: str,
    parsed: ParsedRequest,
    st: GatewayState,
    hdr: dict[str, str],
    served: str,
    outputs: list[HostTensor],
    hops: str,
) -> Response:
    """The KServe v2 HTTP answer (JSON, binary sections, shm writes) with the trace and hops headers."""
    return infer_response(name, served, parsed, outputs, st.shm, {**hdr, HOPS_HEADER: hops})
