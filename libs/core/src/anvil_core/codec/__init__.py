"""The one codec for every flatbuffers message of `proto/anvil.fbs` and `proto/zerocopy.fbs`.

Field tables come from the schema (`make proto` derives them: `fbs_schema.py`); messages are
flatc's object-API classes (`codec.pb.InferRequestT`, ...). `writer` writes them front to back,
`reader` verifies every offset, length, string, vector, enum and stated constraint while it reads,
and raises only `ProtocolError`. docs/protocol.md ("The wire codec") lists the checks.

    parts = codec.pack(pb.HeartbeatT(kind=..., serviceId="ex-1"))       # [envelope]
    body, frames = codec.unpack(parts)                                  # verified
    req = codec.read_request(frame)                                     # verified InferRequestT
"""

from typing import Any

from anvil_core.codec import reader, writer
from anvil_core.codec.dtypes import DTYPE_CODES, DTYPE_NAMES, ITEMSIZE
from anvil_core.codec.envelope import (
    MAX_ENVELOPE_BYTES,
    PROTOCOL_VERSION,
    Body,
    Frame,
    buffer_of,
    pack,
    peek_request_ids,
    read,
    read_request,
    read_response,
    unpack,
)
from anvil_core.codec.errors import REASONS, ProtocolError
from anvil_core.codec.messages import (
    ERROR_NAMES,
    HTTP_STATUS,
    MAX_DIMS,
    MAX_TENSORS,
    BatchTiming,
    ShmSpan,
    build_request,
    build_response,
    bundle,
    check_payloads,
    error,
    request_tensor,
    split_groups,
    tensor_frames,
    unbundle,
)
from anvil_core.codec.schema import table
from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.proto_gen import zerocopy_generated as zpb

__all__ = [
    "DTYPE_CODES",
    "DTYPE_NAMES",
    "ERROR_NAMES",
    "HTTP_STATUS",
    "ITEMSIZE",
    "MAX_DIMS",
    "MAX_ENVELOPE_BYTES",
    "MAX_TENSORS",
    "PROTOCOL_VERSION",
    "REASONS",
    "BatchTiming",
    "Body",
    "Frame",
    "ProtocolError",
    "ShmSpan",
    "buffer_of",
    "build_request",
    "build_response",
    "bundle",
    "check_payloads",
    "decode_table",
    "encode_table",
    "error",
    "pack",
    "pb",
    "peek_request_ids",
    "read",
    "read_request",
    "read_response",
    "request_tensor",
    "split_groups",
    "tensor_frames",
    "unbundle",
    "unpack",
    "zpb",
]


def encode_table(obj: Any, size_prefixed: bool = False) -> bytes:
    """Any wire table (an object-API instance, e.g. `zpb.InferMetaT`) as a root flatbuffer."""
    return writer.encode(obj, table(type(obj).__name__.removesuffix("T")), size_prefixed)


def decode_table(buf: Any, name: str, start: int = 0, end: int | None = None) -> Any:
    """The verified root table `name` ("InferMeta", ...) of the flatbuffer in `buf[start:end]`."""
    return reader.decode(buf, table(name), start, end)
