"""POST /v2/models/{m}/infer: parse, validate, admit, forward to the scheduler, encode the answer.

Bad input is a 4xx with `{"error": ...}` stating the constraint; the gateway never 5xxes on it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from anvil_core import codec, tracing
from anvil_core.codec import pb
from anvil_core.model_spec import ModelSpec, SpecError
from anvil_core.tensors import HostTensor, TensorError
from anvil_gateway import metrics as m
from anvil_gateway import spans
from anvil_gateway.admission import Rejected
from anvil_gateway.backend import BackendUnavailable
from anvil_gateway.body_limits import model_body_limit
from anvil_gateway.hops import HOPS_HEADER, Hops
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import ParsedRequest, parse_request, release_all
from anvil_gateway.responses import HEADER_LENGTH, infer_response
from anvil_gateway.settings import GatewaySettings
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
_T = TypeVar("_T")
TRACE_HEADER = "x-anvil-trace-id"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class Failed(Exception):
    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


def trace_id(headers: Any) -> str:
    """W3C traceparent's trace id, else our own header, else a new id."""
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match:
        return match.group(1)
    given = headers.get(TRACE_HEADER, "")
    if re.fullmatch(r"[0-9A-Za-z-]{8,64}", given):
        return given
    return tracing.current_trace_id() or uuid.uuid4().hex  # traced: the root span's trace


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


async def parse_off_loop(
    st: GatewayState,
    size: int,
    fn: Callable[..., _T],
    *args: Any,
    orphan: Callable[[_T], None] | None = None,
) -> _T:
    """`fn(*args)`, a parse of a body of `size` bytes: inline when small, else on a parse thread,
    with `bulk=True` (json_bulk: steps short enough that the loop gets the GIL between them).
    `orphan` gets the result of a parse whose caller was cancelled meanwhile (to release what the
    parse took, e.g. pinned shm regions)."""
    if size < st.settings.parse_offload_bytes:
        return fn(*args)
    fut = asyncio.get_running_loop().run_in_executor(st.parse_pool, partial(fn, *args, bulk=True))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if orphan is not None:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or orphan(f.result()))
        raise


async def encode_off_loop(st: GatewayState, size: int, fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)`, an answer of about `size` bytes: inline when small, else on a parse thread."""
    if size < st.settings.parse_offload_bytes:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(st.parse_pool, partial(fn, *args))


def qos_params(parsed: ParsedRequest, settings: GatewaySettings) -> tuple[int, float]:
    """Priority class and time budget in s: the class SLO, tightened (never loosened) by `timeout` µs."""
    priority = parsed.parameters.get("priority", settings.default_priority)
    if priority == 0:  # tritonclient's "not set"
        priority = settings.default_priority
    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in (1, 2, 3):
        raise BadRequest("parameters.priority must be 1 (interactive), 2 (standard) or 3 (batch)")
    budget_s = settings.slo_ms(priority) / 1000
    timeout = parsed.parameters.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise BadRequest("parameters.timeout must be a positive integer (µs)")
        budget_s = min(budget_s, timeout / 1e6)
    return priority, budget_s


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
        # Labels only from what the server knows: a client's random model or version names would
        # each add a metrics series and a stats entry (unbounded memory, issue #18).
        spec = st.discovery.models.get(name)
        known = spec is not None and version in (None, spec.version)
        label, vlabel = (name, version or "") if known else ("_unknown", "_unknown" if version else "")
        m.failure.labels(model=label, version=vlabel, reason=exc.reason).inc()
        if known and spec is not None:
            st.stats.failure(name, spec.version, time.perf_counter_ns() - t0)
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
    try:
        with tracing.span("gateway.parse"):
            parsed = await parse_off_loop(
                st,
                len(body),
                parse_request,
                body,
                request.headers.get(HEADER_LENGTH),
                shm,
                tenant,
                orphan=lambda p: release_all(p, shm),
            )
    except ShmError as exc:
        raise Failed(exc.status, str(exc), "shm") from None
    except BadRequest as exc:
        raise Failed(400, str(exc), "bad_request") from None
    try:
        return await _run(st, spec, parsed, tenant, hdr, t0, version)
    finally:
        release_all(parsed, shm)


async def _run(
    st: GatewayState,
    spec: ModelSpec,
    parsed: ParsedRequest,
    tenant: str,
    hdr: dict[str, str],
    t0: int,
    version: str | None = None,
) -> Response:
    name = spec.name
    try:
        spec.validate(parsed.inputs)
        priority, timeout_s = qos_params(parsed, st.settings)
        known = {t.name for t in spec.outputs}
        unknown = [o.name for o in parsed.outputs if o.name not in known]
        if unknown:
            raise BadRequest(f"model {name!r} has no outputs {unknown}; outputs: {sorted(known)}")
    except (BadRequest, SpecError, TensorError) as exc:
        raise Failed(400, str(exc), "bad_request") from None
    hops = Hops(t0)
    resp, outputs = await forward(
        st,
        spec,
        parsed.inputs,
        [o.name for o in parsed.outputs],
        tenant,
        priority,
        timeout_s,
        hdr[TRACE_HEADER],
        version,
        hops,
    )
    served = resp.modelVersion or spec.version  # what answered
    hdr[HOPS_HEADER] = hops.header(resp)
    # JSON text of the outputs: ~20 bytes per number; large answers are written on a parse thread.
    text_bytes = 20 * sum(t.data.size for t in outputs)
    try:
        with tracing.span("gateway.answer"):
            response = await encode_off_loop(
                st, text_bytes, infer_response, name, served, parsed, outputs, st.shm, hdr
            )
    except (BadRequest, ShmError) as exc:
        raise Failed(400, str(exc), "bad_request") from None
    hops.record(resp, priority)
    total_ns = time.perf_counter_ns() - t0
    rows = parsed.inputs[0].shape[0] if spec.max_batch > 0 and parsed.inputs else 1
    st.stats.success(name, spec.version, rows, total_ns, resp)
    m.record_success(name, spec.version, rows, total_ns / 1000, resp.queueUs, resp.computeUs)
    return response


def admit(st: GatewayState, model: str, tenant: str, priority: int) -> None:
    """Take a token and an in-flight slot, or raise Failed(429) with Retry-After (used by `forward`)."""
    try:
        st.admission.admit(model, tenant, priority, time.monotonic())
    except Rejected as exc:
        m.admission_rejected.labels(tenant=tenant, priority=str(priority), reason=exc.reason).inc()
        retry = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        raise Failed(exc.status, str(exc), exc.reason, retry) from None


async def forward(
    st: GatewayState,
    spec: ModelSpec,
    inputs: list[HostTensor],
    outputs: list[str],
    tenant: str,
    priority: int,
    timeout_s: float,
    trace: str,
    version: str | None = None,
    hops: Hops | None = None,
) -> tuple[pb.InferResponseT, list[HostTensor]]:
    """Admit one validated request, send it to the scheduler and return the answer's outputs, or
    raise Failed with a status (429 from admission, 503/504 from the backend, the executor's error).
    ``version``: the one the client named, else None: whichever version serves when the request
    runs (a redeploy switches over without failing requests that named none). ``hops``, when given,
    gets the send and answer times (hops.py)."""
    with tracing.span("gateway.admit"):
        admit(st, spec.name, tenant, priority)
    try:
        request_id = uuid.uuid4().hex
        payloads: list[Any] = []
        envelope = codec.build_request(
            request_id=request_id,
            trace_id=trace,
            model=spec.name,
            version=version or "",
            priority=priority,
            deadline_unix_ns=time.time_ns() + int(timeout_s * 1e9),
            tenant=tenant,
            inputs=codec.tensor_frames(inputs, payloads),
            outputs=outputs,
            traceparent=tracing.traceparent(),  # the root span's, the next hops' parent; None when off
        )
        if hops is not None:
            hops.mark_sent()
        try:
            with tracing.span("gateway.dispatch"):  # sent -> answered
                resp, frames = await st.link.infer(
                    request_id, [envelope, *payloads], timeout_s + 0.05, urgent=priority == 1
                )
        except BackendUnavailable as exc:
            raise Failed(503, f"model {spec.name!r} unavailable: {exc}", "unavailable") from None
        except TimeoutError:
            raise Failed(
                504, f"no answer within the deadline ({timeout_s * 1e3:.0f} ms)", "deadline"
            ) from None
        if hops is not None:
            hops.mark_answered()
        err = resp.error
        if err is not None and err.code != pb.ErrorCode.OK:
            kind = codec.ERROR_NAMES.get(err.code, "ERROR").lower()
            raise Failed(codec.HTTP_STATUS.get(err.code, 500), f"{kind}: {err.reason or ''}", kind)
        try:
            tensors = [codec.request_tensor(t, frames) for t in resp.outputs or ()]
        except TensorError as exc:
            raise Failed(502, f"undecodable answer from the executor: {exc}", "protocol") from None
        return resp, tensors
    finally:
        st.admission.done(spec.name)
