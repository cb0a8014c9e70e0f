"""The one path of an inference request after its front end parsed it: validate, admit, forward to
the scheduler, encode the answer, count it. HTTP (infer.py) and gRPC (grpc_infer.py) each turn
their message into a `ParsedRequest` and an `InferCall`, then call `execute`; failures are `Failed`
with an HTTP status, which each front end answers in its own terms (a JSON error, a gRPC status).
The embeddings route and the ZeroCopy ingress use `forward`.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from anvil_core import codec, tracing
from anvil_core.codec import pb
from anvil_core.model_spec import ModelSpec, SpecError
from anvil_core.tensors import HostTensor, TensorError
from anvil_gateway import metrics as m
from anvil_gateway.admission import Rejected
from anvil_gateway.backend import BackendUnavailable
from anvil_gateway.hops import Hops
from anvil_gateway.json_bulk import Steps
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import ParsedRequest
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.state import GatewayState
from anvil_gateway.sysshm import ShmError

__all__ = [
    "TRACE_HEADER",
    "Failed",
    "InferCall",
    "encode_off_loop",
    "execute",
    "forward",
    "note_failure",
    "parse_off_loop",
    "qos_params",
    "run_steps",
    "trace_id",
]

_T = TypeVar("_T")
TRACE_HEADER = "x-anvil-trace-id"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class Failed(Exception):
    """A request that gets an error answer: `status` (HTTP), `reason` (the failure metric's label)."""

    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


def trace_id(headers: Any) -> str:
    """W3C traceparent's trace id, else our own header, else a new id (HTTP headers or gRPC metadata)."""
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match:
        return match.group(1)
    given = headers.get(TRACE_HEADER, "")
    if re.fullmatch(r"[0-9A-Za-z-]{8,64}", given):
        return given
    return tracing.current_trace_id() or _random_id()  # traced: the root span's trace


def _random_id() -> str:
    """32 random hex digits, like `uuid.uuid4().hex` at a tenth of its cost (~0.5 µs, not ~4.5 µs:
    no UUID object; two per request)."""
    return os.urandom(16).hex()


async def parse_off_loop(
    st: GatewayState,
    size: int,
    fn: Callable[..., _T],
    *args: Any,
    orphan: Callable[[_T], None] | None = None,
) -> _T:
    """`fn(*args)`, a parse of `size` bytes of work (bytes of JSON text, `kserve.parse_cost`): inline
    when small, else on a parse thread,
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


async def run_steps(steps: Steps[_T]) -> _T:
    """Run a stepped parse (json_bulk.Steps) on the event loop, letting every other ready task run
    between two steps: the loop is held one step at a time (~0.25 ms), by this thread only."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


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


@dataclass(slots=True)
class InferCall:
    """One parsed inference request, as every front end hands it to `execute`."""

    spec: ModelSpec  # the model it resolved to
    parsed: ParsedRequest  # inputs, requested outputs, parameters, pinned shm regions
    tenant: str
    trace: str
    t0_ns: int  # perf_counter_ns when the front end took the request
    version: str | None = None  # the version the client named; None: whichever serves
    # The transport's own deadline (a gRPC call's), s from now: tightens the budget like `timeout`.
    deadline_s: float | None = None


# (served version, outputs, the hops header text) -> the front end's answer
Encoder = Callable[[str, list[HostTensor], str], _T]


async def execute(
    st: GatewayState, call: InferCall, encode: Encoder[_T], encode_cost: Callable[[list[HostTensor]], int]
) -> _T:
    """Validate, admit, forward, encode (with `encode`: on a parse thread when `encode_cost` of the
    answer's outputs, in bytes of JSON text, is large) and count one request; raises Failed."""
    spec, parsed = call.spec, call.parsed
    try:
        spec.validate(parsed.inputs)
        priority, budget_s = qos_params(parsed, st.settings)
        known = {t.name for t in spec.outputs}
        unknown = [o.name for o in parsed.outputs if o.name not in known]
        if unknown:
            raise BadRequest(f"model {spec.name!r} has no outputs {unknown}; outputs: {sorted(known)}")
    except (BadRequest, SpecError, TensorError) as exc:
        raise Failed(400, str(exc), "bad_request") from None
    if call.deadline_s is not None:
        if call.deadline_s <= 0:
            raise Failed(504, "the call's deadline passed before it was sent", "deadline")
        budget_s = min(budget_s, call.deadline_s)
    hops = Hops(call.t0_ns)
    asked = [o.name for o in parsed.outputs]
    resp, outputs = await forward(
        st, spec, parsed.inputs, asked, call.tenant, priority, budget_s, call.trace, call.version, hops
    )
    served = resp.modelVersion or spec.version  # what answered
    cost = encode_cost(outputs)
    try:
        with tracing.span("gateway.answer"):
            answer = await encode_off_loop(st, cost, encode, served, outputs, hops.header(resp))
    except (BadRequest, ShmError) as exc:
        raise Failed(400, str(exc), "bad_request") from None
    hops.record(resp, priority)
    total_ns = time.perf_counter_ns() - call.t0_ns
    rows = parsed.inputs[0].shape[0] if spec.max_batch > 0 and parsed.inputs else 1
    st.stats.success(spec.name, spec.version, rows, total_ns, resp)
    m.record_success(spec.name, spec.version, rows, total_ns / 1000, resp.queueUs, resp.computeUs)
    return answer


def note_failure(st: GatewayState, name: str, version: str | None, exc: Failed, t0_ns: int) -> None:
    """Count a failed request in the metrics and the model's statistics."""
    # Labels only from what the server knows: a client's random model or version names would
    # each add a metrics series and a stats entry (unbounded memory, issue #18).
    spec = st.discovery.models.get(name)
    known = spec is not None and version in (None, spec.version)
    label, vlabel = (name, version or "") if known else ("_unknown", "_unknown" if version else "")
    m.failure.labels(model=label, version=vlabel, reason=exc.reason).inc()
    if known and spec is not None:
        st.stats.failure(name, spec.version, time.perf_counter_ns() - t0_ns)


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
        request_id = _random_id()
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
                    request_id,
                    [envelope, *payloads],
                    timeout_s + 0.05,
                    urgent=priority == 1,
                    model="" if version else spec.name,  # a lone request may go to an executor directly
                    rows=inputs[0].shape[0] if spec.max_batch > 0 and inputs and inputs[0].shape else 1,
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
