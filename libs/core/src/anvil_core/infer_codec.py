"""Fast codecs for the per-request messages (InferRequest, InferResponse) and the batch framing.

Per-request messages are written by `fbwrite` (one front-to-back pass; flatbuffers.Builder took
~110 us per request and ~80 us per response) and read through the generated lazy accessors (no
object-API unpacking), because they sit on the hot path of every hop. The scheduler reads four
fields of a request and forwards its envelope frame unchanged.

Batch framing (see proto/anvil.fbs, Batch and BatchResult)::

    [Batch envelope] [req 0 envelope] [req 0 payloads...] [req 1 envelope] [req 1 payloads...] ...
    frame_counts[i] = 1 + number of payload frames of request i

The same framing bundles several requests (gateway -> scheduler, a Batch envelope with only
frame counts) or responses (scheduler -> gateway, a BatchResult envelope) into one ZeroMQ message:
on two cores every message costs a wake-up of each side's I/O thread, so requests that meet in one
event-loop turn travel together. A lone request or response still travels as itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core import fbread, wire
from anvil_core.fbread import (
    FastBatch,
    FastBatchResult,
    FastEnvelope,
    FastInferRequest,
    FastInferResponse,
)
from anvil_core.fbwrite import Node, Str, TableDef, Vec
from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.tensors import HostTensor, TensorError

__all__ = [
    "ShmSpan",
    "build_request",
    "build_response",
    "bundle",
    "open_request",
    "open_response",
    "request_tensor",
    "split_groups",
    "tensor_frames",
    "unbundle",
]

_DTYPE_CODES = wire.DTYPE_CODES
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}


@dataclass(frozen=True, slots=True)
class ShmSpan:
    """Bytes of a tensor that live in a shared-memory region instead of a frame."""

    region: str
    offset: int
    length: int


# Table layouts (slots as in proto/anvil.fbs; the generated Add* functions use the same slots).
_OFF = "off"
_SHM_REF = TableDef([(0, _OFF), (1, "Q"), (2, "Q")])  # region, offset, length
_TENSOR = TableDef([(0, _OFF), (1, "B"), (2, _OFF), (3, "i"), (4, _OFF)])  # name, dtype, shape, frame, shm
# request_id, trace_id, model, model_version, priority, deadline_unix_ns, tenant, inputs, outputs
_REQUEST = TableDef(
    [(0, _OFF), (1, _OFF), (2, _OFF), (3, _OFF), (4, "B"), (5, "q"), (6, _OFF), (7, _OFF), (8, _OFF)]
)
# request_id, trace_id, model, model_version, outputs, error, queue_us, compute_us
_RESPONSE = TableDef([(0, _OFF), (1, _OFF), (2, _OFF), (3, _OFF), (4, _OFF), (5, _OFF), (6, "I"), (7, "I")])


def _tensor(name: str, datatype: str, shape: Sequence[int], frame: int, shm: ShmSpan | None) -> Node:
    ref = None
    if shm is not None:
        ref = Node(_SHM_REF, {0: Str(shm.region), 1: shm.offset, 2: shm.length})
    return Node(_TENSOR, {0: Str(name), 1: _DTYPE_CODES[datatype], 2: Vec("q", shape), 3: frame, 4: ref})


def tensor_frames(tensors: Sequence[HostTensor], frames: list[Any]) -> list[tuple[HostTensor, int]]:
    """Append each tensor's payload to `frames`; returns (tensor, frame index) pairs."""
    out = []
    for t in tensors:
        out.append((t, len(frames)))
        frames.append(t.to_bytes_view())
    return out


def build_request(
    *,
    request_id: str,
    trace_id: str,
    model: str,
    version: str,
    priority: int,
    deadline_unix_ns: int,
    tenant: str,
    inputs: Sequence[tuple[HostTensor, int]] = (),
    shm_inputs: Sequence[tuple[str, str, Sequence[int], ShmSpan]] = (),
    outputs: Sequence[str] = (),
) -> bytes:
    """An InferRequest envelope. `inputs` are (tensor, frame index); `shm_inputs` are
    (name, datatype, shape, span) for bytes that stay in shared memory."""
    tensors = [_tensor(t.name, t.datatype, t.shape, frame, None) for t, frame in inputs]
    tensors += [_tensor(name, dt, shape, -1, span) for name, dt, shape, span in shm_inputs]
    body = {
        0: Str(request_id),
        1: Str(trace_id),
        2: Str(model),
        3: Str(version),
        4: priority,
        5: deadline_unix_ns,
        6: Str(tenant),
        7: Vec(_OFF, tensors),
        8: Vec(_OFF, [Str(o) for o in outputs]) if outputs else None,
    }
    return wire.envelope(pb.Body.InferRequest, Node(_REQUEST, body))


def build_response(
    *,
    request_id: bytes | str,
    trace_id: bytes | str,
    model: bytes | str,
    version: bytes | str = b"",
    outputs: Sequence[tuple[HostTensor, int]] = (),
    error: tuple[int, str] | None = None,
    queue_us: int = 0,
    compute_us: int = 0,
) -> bytes:
    """An InferResponse envelope: outputs (tensor, frame index), or an error (code, reason)."""
    err = None if error is None else wire.error_node(*error)
    body = {
        0: Str(request_id),
        1: Str(trace_id),
        2: Str(model),
        3: Str(version),
        4: Vec(_OFF, [_tensor(t.name, t.datatype, t.shape, frame, None) for t, frame in outputs]),
        5: err,
        6: max(0, min(queue_us, 2**32 - 1)),
        7: max(0, min(compute_us, 2**32 - 1)),
    }
    return wire.envelope(pb.Body.InferResponse, Node(_RESPONSE, body))


def _envelope(frame: Any) -> tuple[int, Any]:
    """(body type, body table or None) of an envelope frame of this protocol version."""
    buf = bytes(frame.buffer if hasattr(frame, "buffer") else frame)
    try:
        env = FastEnvelope.root(buf)
        version = env.Version()
        kind = env.BodyType()
        table = env.Body()
    except Exception as exc:  # flatbuffers raises struct/index errors on garbage
        raise wire.ProtocolError(f"undecodable envelope ({type(exc).__name__})") from None
    if version != wire.PROTOCOL_VERSION:
        raise wire.ProtocolError(
            f"protocol version {version} received, this side speaks {wire.PROTOCOL_VERSION}"
        )
    return kind, table


def _open(frame: Any, body_type: int, cls: type) -> Any:
    kind, table = _envelope(frame)
    if kind != body_type or table is None:
        raise wire.ProtocolError(f"expected body type {body_type}, got {kind}")
    view = cls()
    view.Init(table.Bytes, table.Pos)
    return view


def open_request(frame: Any) -> pb.InferRequest:
    """Lazy view of an InferRequest envelope frame (fields are read on access, see fbread)."""
    view: pb.InferRequest = _open(frame, pb.Body.InferRequest, FastInferRequest)
    return view


def open_response(frame: Any) -> pb.InferResponse:
    view: pb.InferResponse = _open(frame, pb.Body.InferResponse, FastInferResponse)
    return view


def request_tensor(t: pb.Tensor, frames: Sequence[Any]) -> HostTensor:
    """Rebuild a frame-backed tensor from its lazy view; every field is checked."""
    name = (t.Name() or b"").decode(errors="replace")
    datatype = _DTYPE_NAMES.get(t.Dtype())
    if datatype is None:
        raise TensorError(f"tensor {name!r}: unknown dtype code {t.Dtype()}")
    shape = fbread.shape(t)
    index = t.Frame()
    if index < 0 or index >= len(frames):
        raise TensorError(f"tensor {name!r}: frame index {index} outside 0..{len(frames) - 1}")
    raw = frames[index]
    return HostTensor.from_buffer(name, datatype, shape, raw.buffer if hasattr(raw, "buffer") else raw)


def split_groups(frames: Sequence[Any], counts: Sequence[int]) -> Iterator[list[Any]]:
    """Cut the frames after a Batch/BatchResult envelope into per-request groups."""
    if sum(counts) != len(frames) or any(c < 1 for c in counts):
        raise wire.ProtocolError(f"frame counts {list(counts)} do not add up to {len(frames)} frames")
    pos = 0
    for count in counts:
        yield list(frames[pos : pos + count])
        pos += count


_BUNDLES: dict[int, type] = {pb.Body.Batch: FastBatch, pb.Body.BatchResult: FastBatchResult}


def bundle(groups: Sequence[Sequence[Any]], *, responses: bool) -> list[Any]:
    """One message for several [envelope, *payloads] groups (itself when there is one group)."""
    if len(groups) == 1:
        return list(groups[0])
    head: pb.BatchT | pb.BatchResultT = pb.BatchResultT() if responses else pb.BatchT()
    head.frameCounts = [len(g) for g in groups]
    return wire.pack(head, [frame for g in groups for frame in g])


def unbundle(parts: Sequence[Any]) -> list[list[Any]]:
    """The per-request groups of one message: a bundle's groups, or the message itself."""
    if not parts:
        raise wire.ProtocolError("empty message")
    kind, table = _envelope(parts[0])
    cls = _BUNDLES.get(kind)
    if cls is None or table is None:
        return [list(parts)]
    head = cls()
    head.Init(table.Bytes, table.Pos)
    counts = [head.FrameCounts(j) for j in range(head.FrameCountsLength())]
    return list(split_groups(parts[1:], counts))
