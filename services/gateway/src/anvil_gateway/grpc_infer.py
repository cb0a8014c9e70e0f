"""ModelInfer and ModelStreamInfer: a ModelInferRequest becomes the same `InferCall` an HTTP request
becomes, and goes through the same path (request_path.execute): validation, admission, priorities,
deadlines, tenants, statistics and errors are HTTP's. What differs is only the parse (grpc_codec.py)
and how an error is answered: a gRPC status for ModelInfer, an `error_message` in the stream (which
stays open) for ModelStreamInfer.

The size check: gRPC refuses messages over ``grpc.max_receive_message_length`` (the server's
``max_body_bytes``, which bounds every model's limit) before the handler runs; the model's own limit
(body_limits.py, the same as HTTP's) is checked on the message's size here, before it is parsed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import grpc

from anvil_core import tracing
from anvil_core.logs import get_logger
from anvil_core.tensors import HostTensor
from anvil_gateway import metrics as m
from anvil_gateway.admission import Rejected
from anvil_gateway.body_limits import model_body_limit
from anvil_gateway.grpc_codec import encode_response, parse_infer_request
from anvil_gateway.grpc_status import abort, metadata
from anvil_gateway.hops import HOPS_HEADER
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import ParsedRequest, release_all
from anvil_gateway.proto_gen import grpc_service_pb2 as pb
from anvil_gateway.request_path import (
    TRACE_HEADER,
    Failed,
    InferCall,
    execute,
    note_failure,
    parse_off_loop,
    trace_id,
)
from anvil_gateway.state import GatewayState, NotFound
from anvil_gateway.sysshm import ShmError

__all__ = ["infer_one", "model_infer", "model_stream_infer"]

log = get_logger("anvil.gateway.grpc")
# Encoding an answer copies each output's bytes once: about a byte per element of work (the
# parse_offload_bytes threshold then sends answers of >= 64 Ki elements to a parse thread).
RAW_COST_PER_ELEMENT = 1


async def infer_one(
    st: GatewayState, req: pb.ModelInferRequest, md: Any, trace: str, t0_ns: int, deadline_s: float | None
) -> tuple[pb.ModelInferResponse, str]:
    """One request, start to answer: (the response, its hops header text); raises Failed. Traced: in
    a root span (a child of the call's `traceparent` metadata), as HTTP's (spans.py)."""
    if tracing.ON:
        attrs = {"anvil.model": req.model_name, "rpc.system": "grpc"}
        with tracing.server_span("gateway.grpc_infer", md.get("traceparent"), attrs):
            return await _infer_one(st, req, md, trace, t0_ns, deadline_s)
    return await _infer_one(st, req, md, trace, t0_ns, deadline_s)


async def _infer_one(
    st: GatewayState, req: pb.ModelInferRequest, md: Any, trace: str, t0_ns: int, deadline_s: float | None
) -> tuple[pb.ModelInferResponse, str]:
    name, version = req.model_name, req.model_version or None
    try:
        tenant = st.admission.tenant(md)
    except Rejected as exc:
        raise Failed(exc.status, str(exc), exc.reason) from None
    try:
        spec = await st.resolve(name, version)
    except NotFound as exc:
        raise Failed(404, str(exc), "not_found") from None
    limit, why = model_body_limit(spec, st.settings.max_body_bytes)
    size = req.ByteSize()
    if size > limit:
        raise Failed(413, f"request of {size} bytes exceeds the limit of {limit} bytes ({why})", "too_large")
    shm = st.shm if st.shm.enabled else None
    try:
        with tracing.span("gateway.parse"):
            parsed = await parse_off_loop(
                st, size, parse_infer_request, req, shm, tenant, orphan=lambda p: release_all(p, shm)
            )
    except ShmError as exc:
        raise Failed(exc.status, str(exc), "shm") from None
    except BadRequest as exc:
        raise Failed(400, str(exc), "bad_request") from None
    call = InferCall(spec, parsed, tenant, trace, t0_ns, version, deadline_s)
    try:
        return await execute(st, call, partial(_answer, spec.name, parsed), _answer_cost)
    finally:
        release_all(parsed, shm)


def _answer_cost(outputs: list[HostTensor]) -> int:
    return RAW_COST_PER_ELEMENT * sum(t.data.size for t in outputs)


def _answer(
    name: str, parsed: ParsedRequest, served: str, outputs: list[HostTensor], hops: str
) -> tuple[pb.ModelInferResponse, str]:
    return encode_response(name, served, parsed, outputs), hops


async def model_infer(
    st: GatewayState, req: pb.ModelInferRequest, context: grpc.aio.ServicerContext
) -> pb.ModelInferResponse:
    t0 = time.perf_counter_ns()
    md = metadata(context)
    trace = trace_id(md)
    m.inflight.inc()
    try:
        resp, hops = await infer_one(st, req, md, trace, t0, context.time_remaining())
    except Failed as exc:
        note_failure(st, req.model_name, req.model_version or None, exc, t0)
        await abort(context, exc, trace)
    finally:
        m.inflight.dec()
    context.set_trailing_metadata(((TRACE_HEADER, trace), (HOPS_HEADER, hops)))
    return resp


def _error_answer(req: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    echo = pb.ModelInferResponse(model_name=req.model_name, model_version=req.model_version, id=req.id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=echo)


async def model_stream_infer(
    st: GatewayState, requests: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """Requests of the stream run concurrently, each answered once, in the order answers come (match
    them by `id`). At most ``grpc_stream_max_pending`` are unanswered at a time: past that the
    stream is not read (HTTP/2 flow control holds the client back), so a client that sends without
    reading cannot grow the gateway's memory."""
    md = metadata(context)  # the stream's metadata (API key, trace) holds for all its requests
    answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
    slots = asyncio.Semaphore(st.settings.grpc_stream_max_pending)
    running: set[asyncio.Task[None]] = set()

    async def one(req: pb.ModelInferRequest) -> None:
        t0 = time.perf_counter_ns()
        m.inflight.inc()
        try:
            resp, _ = await infer_one(st, req, md, trace_id(md), t0, context.time_remaining())
            answers.put_nowait(pb.ModelStreamInferResponse(infer_response=resp))
        except Failed as exc:
            note_failure(st, req.model_name, req.model_version or None, exc, t0)
            answers.put_nowait(_error_answer(req, str(exc)))
        except Exception:  # a bug, never bad input: this request fails, the stream goes on
            log.exception("stream infer failed")
            answers.put_nowait(_error_answer(req, "internal error (logged by the gateway)"))
        finally:
            m.inflight.dec()

    async def read() -> None:
        try:
            async for req in requests:
                await slots.acquire()
                task = asyncio.create_task(one(req))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
        finally:
            answers.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (answer := await answers.get()) is not None:
            slots.release()
            yield answer
        await reader  # the reader's own failure (a broken stream) surfaces here
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
