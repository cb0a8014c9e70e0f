"""Envelopes: every message between services, written and read (verified) one way.

Frame layout of one ZeroMQ message (after any ROUTER identity frames)::

    frame 0        Envelope (flatbuffer): protocol version + one Body (InferRequest, Batch, ...)
    frame 1..n     raw tensor payloads, sent with copy=False; Tensor.frame = i refers to frame 1 + i

Tensor bytes are never inside the flatbuffer and never pickled. A receiver reads frame 0 with
`read` (or `read_request` / `read_response`), which verifies the whole envelope before returning it
and refuses another version; everything refused raises `ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeAlias

from anvil_core.codec import reader, writer
from anvil_core.codec.errors import ProtocolError
from anvil_core.codec.schema import TableDesc, table
from anvil_core.proto_gen import anvil_generated as pb

__all__ = [
    "MAX_ENVELOPE_BYTES",
    "PROTOCOL_VERSION",
    "Body",
    "Frame",
    "buffer_of",
    "pack",
    "peek_request_ids",
    "read",
    "read_request",
    "read_response",
    "unpack",
]

PROTOCOL_VERSION = 1
MAX_ENVELOPE_BYTES = 1 << 20  # a request's envelope is ~300 B, a Register with many models a few KB

Frame: TypeAlias = bytes | bytearray | memoryview | Any  # Any: zmq.Frame (buffer protocol)
Body: TypeAlias = Any  # one of pb.InferRequestT, InferResponseT, BatchT, BatchResultT, RegisterT, ...

_ENVELOPE = table("Envelope")
_BODY_TYPES: dict[type, int] = {
    table(name).cls: value for name, value in vars(pb.Body).items() if not name.startswith("_") and value
}


def buffer_of(frame: Frame) -> Any:
    """The bytes of a frame without copying (a zmq.Frame's buffer, or the object itself)."""
    return frame.buffer if hasattr(frame, "buffer") else frame


def pack(body: Body, frames: Sequence[Frame] = ()) -> list[Frame]:
    """Envelope `body` (an object-API instance) and return the parts to send: [envelope, *frames]."""
    try:
        body_type = _BODY_TYPES[type(body)]
    except KeyError:
        raise TypeError(f"not a wire message: {type(body).__name__}") from None
    env = pb.EnvelopeT(version=PROTOCOL_VERSION, bodyType=body_type, body=body)
    return [writer.encode(env, _ENVELOPE), *frames]


def read(frame: Frame, desc: TableDesc = _ENVELOPE) -> Body:
    """The verified body of an envelope frame of this protocol version."""
    buf = buffer_of(frame)
    if len(buf) > MAX_ENVELOPE_BYTES:
        raise ProtocolError(f"envelope of {len(buf)} bytes; at most {MAX_ENVELOPE_BYTES}", "too_large")
    env = reader.decode(buf, desc)
    if env.version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {env.version} received, this side speaks {PROTOCOL_VERSION}", "version"
        )
    if env.body is None:
        raise ProtocolError(f"envelope carries no body (body type {env.bodyType})", "invalid")
    return env.body


def unpack(parts: Sequence[Frame]) -> tuple[Body, list[Frame]]:
    """[envelope, *frames] -> (verified body, frames)."""
    if not parts:
        raise ProtocolError("empty message")
    return read(parts[0]), list(parts[1:])


def _read_as(frame: Frame, cls: type) -> Any:
    body = read(frame)
    if type(body) is not cls:
        raise ProtocolError(
            f"expected {cls.__name__.removesuffix('T')}, got {type(body).__name__.removesuffix('T')}",
            "unexpected",
        )
    return body


def read_request(frame: Frame) -> pb.InferRequestT:
    """A verified InferRequest envelope frame."""
    return _read_as(frame, pb.InferRequestT)  # type: ignore[no-any-return]


def read_response(frame: Frame) -> pb.InferResponseT:
    """A verified InferResponse envelope frame."""
    return _read_as(frame, pb.InferResponseT)  # type: ignore[no-any-return]


def _ids_only(desc: TableDesc) -> TableDesc:
    """`desc` reduced to its request_id and trace_id fields (the rest is not looked at)."""
    return replace(desc, fields=[f for f in desc.fields if f.name in ("request_id", "trace_id")])


_PEEK = replace(
    _ENVELOPE,
    fields=[
        f if f.name != "body" else replace(f, union={pb.Body.InferRequest: _ids_only(table("InferRequest"))})
        for f in _ENVELOPE.fields
    ],
)


def peek_request_ids(frame: Frame) -> tuple[str, str] | None:
    """(request id, trace id) of an InferRequest envelope that failed `read`, if those two fields
    still verify (so its sender can be answered with an error); None when they do not."""
    try:
        body = read(frame, _PEEK)
    except ProtocolError:
        return None
    return body.requestId, body.traceId or ""
