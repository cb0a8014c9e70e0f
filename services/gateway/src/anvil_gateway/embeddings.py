"""OpenAI-compatible `POST /v1/embeddings` over any model that maps text to vectors.

An embedding model declares one BYTES input (a string per row) and an FP32 output of one vector per
row; an optional INT32 output `TOKENS` (tokens per row) feeds `usage`. Errors use OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`), which its clients parse.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from anvil_core import tracing
from anvil_core.model_spec import ModelSpec
from anvil_core.tensors import HostTensor
from anvil_gateway import json_codec, spans
from anvil_gateway import metrics as m
from anvil_gateway.admission import Rejected
from anvil_gateway.hops import HOPS_HEADER, Hops
from anvil_gateway.infer import read_body
from anvil_gateway.kserve import BadRequest, parse_json_document
from anvil_gateway.request_path import TRACE_HEADER, Failed, forward, parse_off_loop, trace_id
from anvil_gateway.state import GatewayState, state_of

__all__ = ["encode_embeddings", "handle_embeddings", "oa_error", "router"]

router = APIRouter()
MAX_CHARS = 100_000  # per input string; the tokenizer truncates long inputs anyway


def oa_error(
    status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def embedding_io(spec: ModelSpec) -> tuple[str, str, str | None]:
    """(text input, vector output, token-count output or None) of an embedding model."""
    texts = [t for t in spec.inputs if t.datatype == "BYTES"]
    vectors = [t for t in spec.outputs if t.datatype == "FP32"]
    if len(spec.inputs) != 1 or len(texts) != 1 or not vectors or spec.max_batch < 1:
        raise BadRequest(
            f"model {spec.name!r} is not a text-embedding model (one BYTES input, an FP32 output)"
        )
    tokens = next((t.name for t in spec.outputs if t.name == "TOKENS"), None)
    return texts[0].name, vectors[0].name, tokens


def parse(doc: dict[str, Any], max_batch: int) -> tuple[list[str], str]:
    raw = doc.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(t, str) for t in items):
        raise BadRequest("'input' must be a non-empty string or a non-empty list of strings")
    if len(items) > max_batch:
        raise BadRequest(f"at most {max_batch} inputs per request for this model, got {len(items)}")
    if any(len(t) > MAX_CHARS for t in items):
        raise BadRequest(f"each input is limited to {MAX_CHARS} characters")
    if any(not t for t in items):
        raise BadRequest("inputs must be non-empty strings")
    fmt = doc.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'")
    if doc.get("dimensions") is not None:
        raise BadRequest("'dimensions' is not supported: the model's full vector is returned")
    return items, str(fmt)


@router.post("/v1/embeddings", response_model=None)
async def embeddings(request: Request) -> Response:
    """OpenAI-compatible embeddings (input: string or list; encoding_format float|base64; usage).
    The per-hop split travels back in ``x-anvil-hops-us`` as for KServe infer (hops.py)."""
    return await handle_embeddings(state_of(request), request)


async def handle_embeddings(st: GatewayState, request: Request) -> Response:
    """The route's body; the ASGI front (fastpath.py) calls it without FastAPI's routing and
    middleware around it, as for KServe infer. Traced under the root span when tracing is on."""
    if tracing.ON:  # the root span (spans.py)
        return await spans.server("gateway.embeddings", request, "", lambda: _embeddings(st, request))
    return await _embeddings(st, request)


async def _embeddings(st: GatewayState, request: Request) -> Response:
    hops = Hops(time.perf_counter_ns())
    hdr = {TRACE_HEADER: trace_id(request.headers)}
    try:
        tenant = st.admission.tenant(request.headers)
    except Rejected as exc:
        return oa_error(exc.status, str(exc), "authentication_error", hdr)
    try:
        # The model is named in the body: the global cap bounds it; a large one is parsed off the loop.
        raw = await read_body(request, st.settings.max_body_bytes, large=st.settings.parse_offload_bytes)
        doc = await parse_off_loop(st, len(raw), parse_json_document, raw)
        name = doc.get("model")
        if isinstance(name, str) and name not in st.discovery.models:
            await st.discovery.learn(name)  # deployed a moment ago: not in the snapshot yet
        if not isinstance(name, str) or name not in st.discovery.models:
            return oa_error(404, f"unknown model {name!r}; known: {sorted(st.discovery.models)}", headers=hdr)
        spec = st.discovery.models[name]
        text_in, vec_out, tok_out = embedding_io(spec)
        texts, fmt = parse(doc, spec.max_batch)
    except BadRequest as exc:
        return oa_error(400, str(exc), headers=hdr)
    except Failed as exc:
        return oa_error(exc.status, str(exc), headers=hdr)
    priority = st.settings.default_priority
    timeout_s = st.settings.slo_ms(priority) / 1000
    t0 = time.perf_counter()
    tensor = HostTensor.from_array(text_in, "BYTES", np.array([t.encode() for t in texts], dtype=object))
    try:
        resp, outputs = await forward(
            st,
            spec,
            [tensor],
            [vec_out] + ([tok_out] if tok_out else []),
            tenant,
            priority,
            timeout_s,
            hdr[TRACE_HEADER],
            hops=hops,
        )
    except Failed as exc:
        m.failure.labels(model=name, version=spec.version, reason=exc.reason).inc()
        st.stats.failure(name, spec.version, int((time.perf_counter() - t0) * 1e9))
        kind = (
            "rate_limit_error"
            if exc.status == 429
            else "server_error"
            if exc.status >= 500
            else "invalid_request_error"
        )
        return oa_error(exc.status, str(exc), kind, {**hdr, **exc.headers})
    got = {t.name: t.data for t in outputs}
    vectors = np.asarray(got[vec_out], dtype=np.float32)  # (n, D)
    tokens = int(np.asarray(got[tok_out]).sum()) if tok_out and tok_out in got else 0
    m.record_success(name, spec.version, len(texts), (time.perf_counter() - t0) * 1e6, None, None)
    st.stats.success(name, spec.version, len(texts), int((time.perf_counter() - t0) * 1e9), resp)
    hdr[HOPS_HEADER] = hops.header(resp)
    body = encode_embeddings(vectors, fmt, name, tokens)
    hops.record(resp, priority)
    return Response(body, media_type="application/json", headers=hdr)


def encode_embeddings(vectors: np.ndarray, fmt: str, model: str, tokens: int) -> bytes:
    """The OpenAI response body for ``vectors`` (n, D) float32.

    Floats are written as float32's shortest round-trip spelling (orjson's numpy path, what TEI
    and infinity answer): each parses back to the same float32. The float64 spelling of each
    float32 (what ``tolist()`` gives, the v2 JSON path's contract) is twice the bytes and cost the
    gateway 22% of its CPU serving MiniLM from the GPU (bench/results/minilm_gpu.md). A non-finite
    value (orjson would write null) goes through json_codec, which writes NaN/Infinity like the v2 path.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # rows must be C-contiguous for orjson
    data: list[dict[str, Any]] = []
    for i, vec in enumerate(vectors):
        value: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode() if fmt == "base64" else vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    if fmt != "base64" and not np.isfinite(vectors).all():
        return json_codec.dumps(body)
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
