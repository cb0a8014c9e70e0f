"""Fast codecs for the per-request messages (InferRequest, InferResponse) and the batch framing.

Per-request messages are built with hand-written flatbuffers builders and read through the
generated lazy accessors (no object-API unpacking), because they sit on the hot path of every
hop. The scheduler reads four fields of a request and forwards its envelope frame unchanged.

Batch framing (see proto/anvil.fbs, Batch and BatchResult)::

    [Batch envelope] [req 0 envelope] [req 0 payloads...] [req 1 envelope] [req 1 payloads...] ...
    frame_counts[i] = 1 + number of payload frames of request i
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np

from anvil_core import wire
from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.tensors import HostTensor, TensorError

__all__ = [
    "ShmSpan",
    "build_request",
    "build_response",
    "open_request",
    "open_response",
    "request_tensor",
    "split_groups",
    "tensor_frames",
]

_DTYPE_CODES = wire.DTYPE_CODES
_DTYPE_NAMES = {code: name for name, code in _DTYPE_CODES.items()}


@dataclass(frozen=True, slots=True)
class ShmSpan:
    """Bytes of a tensor that live in a shared-memory region instead of a frame."""

    region: str
    offset: int
    length: int


def _tensor(
    b: flatbuffers.Builder, name: str, datatype: str, shape: Sequence[int], frame: int, shm: ShmSpan | None
) -> int:
    name_off = b.CreateString(name)
    shape_off = b.CreateNumpyVector(np.asarray(shape, dtype=np.int64))
    shm_off = 0
    if shm is not None:
        region_off = b.CreateString(shm.region)
        pb.ShmRefStart(b)
        pb.ShmRefAddRegion(b, region_off)
        pb.ShmRefAddOffset(b, shm.offset)
        pb.ShmRefAddLength(b, shm.length)
        shm_off = pb.ShmRefEnd(b)
    pb.TensorStart(b)
    pb.TensorAddName(b, name_off)
    pb.TensorAddDtype(b, _DTYPE_CODES[datatype])
    pb.TensorAddShape(b, shape_off)
    pb.TensorAddFrame(b, frame)
    if shm_off:
        pb.TensorAddShm(b, shm_off)
    return int(pb.TensorEnd(b))


def _vector(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return int(b.EndVector())


def _finish(b: flatbuffers.Builder, body_type: int, body: int) -> bytes:
    pb.EnvelopeStart(b)
    pb.EnvelopeAddVersion(b, wire.PROTOCOL_VERSION)
    pb.EnvelopeAddBodyType(b, body_type)
    pb.EnvelopeAddBody(b, body)
    b.Finish(pb.EnvelopeEnd(b))
    return bytes(b.Output())


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
    b = flatbuffers.Builder(256 + 64 * (len(inputs) + len(shm_inputs)))
    tensors = [_tensor(b, t.name, t.datatype, t.shape, frame, None) for t, frame in inputs]
    tensors += [_tensor(b, name, dt, shape, -1, span) for name, dt, shape, span in shm_inputs]
    inputs_off = _vector(b, tensors)
    outputs_off = _vector(b, [b.CreateString(o) for o in outputs]) if outputs else 0
    rid, tid, mod, ver, ten = (b.CreateString(s) for s in (request_id, trace_id, model, version, tenant))
    pb.InferRequestStart(b)
    pb.InferRequestAddRequestId(b, rid)
    pb.InferRequestAddTraceId(b, tid)
    pb.InferRequestAddModel(b, mod)
    pb.InferRequestAddModelVersion(b, ver)
    pb.InferRequestAddPriority(b, priority)
    pb.InferRequestAddDeadlineUnixNs(b, deadline_unix_ns)
    pb.InferRequestAddTenant(b, ten)
    pb.InferRequestAddInputs(b, inputs_off)
    if outputs_off:
        pb.InferRequestAddOutputs(b, outputs_off)
    return _finish(b, pb.Body.InferRequest, pb.InferRequestEnd(b))


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
    b = flatbuffers.Builder(256 + 64 * len(outputs))
    tensors = [_tensor(b, t.name, t.datatype, t.shape, frame, None) for t, frame in outputs]
    outputs_off = _vector(b, tensors)
    err_off = 0
    if error is not None:
        reason = b.CreateString(error[1])
        pb.ErrorStart(b)
        pb.ErrorAddCode(b, error[0])
        pb.ErrorAddReason(b, reason)
        err_off = pb.ErrorEnd(b)
    rid, tid, mod, ver = (b.CreateString(s) for s in (request_id, trace_id, model, version))
    pb.InferResponseStart(b)
    pb.InferResponseAddRequestId(b, rid)
    pb.InferResponseAddTraceId(b, tid)
    pb.InferResponseAddModel(b, mod)
    pb.InferResponseAddModelVersion(b, ver)
    pb.InferResponseAddOutputs(b, outputs_off)
    if err_off:
        pb.InferResponseAddError(b, err_off)
    pb.InferResponseAddQueueUs(b, max(0, min(queue_us, 2**32 - 1)))
    pb.InferResponseAddComputeUs(b, max(0, min(compute_us, 2**32 - 1)))
    return _finish(b, pb.Body.InferResponse, pb.InferResponseEnd(b))


def _open(frame: Any, body_type: int, cls: type) -> Any:
    buf = bytes(frame.buffer if hasattr(frame, "buffer") else frame)
    try:
        env = pb.Envelope.GetRootAs(buf, 0)
        version = env.Version()
        kind = env.BodyType()
        table = env.Body()
    except Exception as exc:  # flatbuffers raises struct/index errors on garbage
        raise wire.ProtocolError(f"undecodable envelope ({type(exc).__name__})") from None
    if version != wire.PROTOCOL_VERSION:
        raise wire.ProtocolError(
            f"protocol version {version} received, this side speaks {wire.PROTOCOL_VERSION}"
        )
    if kind != body_type or table is None:
        raise wire.ProtocolError(f"expected body type {body_type}, got {kind}")
    view = cls()
    view.Init(table.Bytes, table.Pos)
    return view


def open_request(frame: Any) -> pb.InferRequest:
    """Lazy view of an InferRequest envelope frame (fields are read on access)."""
    view: pb.InferRequest = _open(frame, pb.Body.InferRequest, pb.InferRequest)
    return view


def open_response(frame: Any) -> pb.InferResponse:
    view: pb.InferResponse = _open(frame, pb.Body.InferResponse, pb.InferResponse)
    return view


def request_tensor(t: pb.Tensor, frames: Sequence[Any]) -> HostTensor:
    """Rebuild a frame-backed tensor from its lazy view; every field is checked."""
    name = (t.Name() or b"").decode(errors="replace")
    datatype = _DTYPE_NAMES.get(t.Dtype())
    if datatype is None:
        raise TensorError(f"tensor {name!r}: unknown dtype code {t.Dtype()}")
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
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
