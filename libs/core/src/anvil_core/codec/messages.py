"""Per-request messages (InferRequest, InferResponse), their tensors, and the batch framing.

Batch framing (see proto/anvil.fbs, Batch and BatchResult)::

    [Batch envelope] [req 0 envelope] [req 0 payloads...] [req 1 envelope] [req 1 payloads...] ...
    frame_counts[i] = 1 + number of payload frames of request i

The same framing bundles several requests (gateway -> scheduler, a Batch envelope with only frame
counts) or responses (scheduler -> gateway, a BatchResult envelope) into one ZeroMQ message: on two
cores every message costs a wake-up of each side's I/O thread, so requests that meet in one
event-loop turn travel together. A lone request or response travels as itself.

`check_payloads` is the part of verification that needs the frames as well as the envelope: tensor
counts and ranks, frame indices and sizes, shared-memory references.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core.codec.dtypes import DTYPE_CODES, DTYPE_NAMES, ITEMSIZE
from anvil_core.codec.envelope import Frame, buffer_of, pack, read
from anvil_core.codec.errors import ProtocolError
from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.tensors import HostTensor, TensorError

__all__ = [
    "ERROR_NAMES",
    "HTTP_STATUS",
    "MAX_DIMS",
    "MAX_TENSORS",
    "BatchTiming",
    "ShmSpan",
    "build_request",
    "build_response",
    "bundle",
    "check_payloads",
    "error",
    "request_tensor",
    "split_groups",
    "tensor_frames",
    "unbundle",
]

MAX_TENSORS = 64  # inputs or outputs of one request: no served model has more
MAX_DIMS = 8
MAX_BATCH_SIZE = 1 << 20  # InferResponse.batch_size's schema bound (rows)
MAX_BATCH_INDEX = (1 << 16) - 1  # InferResponse.batch_index's schema bound
MAX_SHM_BYTES = 1 << 40  # 1 TiB: no region is larger; larger is a crafted length

ERROR_NAMES: dict[int, str] = {v: k for k, v in vars(pb.ErrorCode).items() if not k.startswith("_")}

# ErrorCode -> the HTTP status that carries the same failure (the gateway's answers, and clients
# that count ZeroCopy statuses, whose 1..8 are these codes, like HTTP ones).
HTTP_STATUS: dict[int, int] = {
    pb.ErrorCode.OK: 200,
    pb.ErrorCode.BAD_REQUEST: 400,
    pb.ErrorCode.NOT_FOUND: 404,
    pb.ErrorCode.OVERLOAD: 429,
    pb.ErrorCode.UNAVAILABLE: 503,
    pb.ErrorCode.DEADLINE: 504,
    pb.ErrorCode.CANCELLED: 499,
    pb.ErrorCode.PROTOCOL: 502,
    pb.ErrorCode.INTERNAL: 500,
}


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """What the executor measured of one batch, as every answered request of it carries it
    (InferResponse.batch_size ... exec_queue_us; docs/observability.md). Durations in µs."""

    size: int  # inferences (rows) the batch executed
    input_us: int  # copy-in: inputs decoded, checked, gathered
    infer_us: int  # the model run
    output_us: int  # copy-out: outputs into payload buffers
    exec_queue_us: int = 0  # received by the executor -> the batch starts
    # per-hop stamps, wall clock ns since the epoch (0: not stamped; docs/scheduler.md "Per-hop
    # timing"): the scheduler's dispatch (Batch.sent_unix_ns), the executor's receipt, answers built
    dispatched_unix_ns: int = 0
    executor_in_unix_ns: int = 0
    done_unix_ns: int = 0


@dataclass(frozen=True, slots=True)
class ShmSpan:
    """Bytes of a tensor that live in a shared-memory region instead of a frame."""

    region: str
    offset: int
    length: int


def error(code: int, reason: str) -> pb.ErrorT:
    """An Error table; `code` is a pb.ErrorCode value and `reason` states the violated constraint."""
    return pb.ErrorT(code=code, reason=reason)


def _tensor(name: str, datatype: str, shape: Sequence[int], frame: int, shm: ShmSpan | None) -> pb.TensorT:
    ref = None if shm is None else pb.ShmRefT(region=shm.region, offset=shm.offset, length=shm.length)
    return pb.TensorT(name=name, dtype=DTYPE_CODES[datatype], shape=shape, frame=frame, shm=ref)


def tensor_frames(tensors: Sequence[HostTensor], frames: list[Any]) -> list[tuple[HostTensor, int]]:
    """Append each tensor's payload to `frames` (no copy for fixed-size dtypes); returns (tensor,
    frame index) pairs."""
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
    traceparent: str | None = None,
) -> bytes:
    """An InferRequest envelope. `inputs` are (tensor, frame index); `shm_inputs` are (name,
    datatype, shape, span) for bytes that stay in shared memory; `traceparent` the W3C trace
    context of the sender's span (None: not traced)."""
    tensors = [_tensor(t.name, t.datatype, t.shape, frame, None) for t, frame in inputs]
    tensors += [_tensor(name, dt, shape, -1, span) for name, dt, shape, span in shm_inputs]
    body = pb.InferRequestT(
        requestId=request_id,
        traceId=trace_id,
        model=model,
        modelVersion=version,
        priority=priority,
        deadlineUnixNs=deadline_unix_ns,
        tenant=tenant,
        inputs=tensors,
        outputs=list(outputs) or None,
        traceparent=traceparent,
    )
    return bytes(pack(body)[0])


def build_response(
    *,
    request_id: str,
    trace_id: str | None,
    model: str | None,
    version: str | None = "",
    outputs: Sequence[tuple[HostTensor, int]] = (),
    error: tuple[int, str] | None = None,
    queue_us: int = 0,
    compute_us: int = 0,
    batch: BatchTiming | None = None,
    batch_index: int = 0,
) -> bytes:
    """An InferResponse envelope: outputs (tensor, frame index), or an error (code, reason).
    `batch`: the executor's measurements of the batch the request ran in, `batch_index` the
    answer's place in it (0 counts the batch in the gateway's statistics)."""
    body = pb.InferResponseT(
        requestId=request_id,
        traceId=trace_id,
        model=model,
        modelVersion=version,
        outputs=[_tensor(t.name, t.datatype, t.shape, frame, None) for t, frame in outputs],
        error=None if error is None else pb.ErrorT(code=error[0], reason=error[1]),
        queueUs=_u32(queue_us),
        computeUs=_u32(compute_us),
    )
    if batch is not None:
        body.batchSize = min(batch.size, MAX_BATCH_SIZE)
        body.batchIndex = min(batch_index, MAX_BATCH_INDEX)
        body.computeInputUs = _u32(batch.input_us)
        body.computeInferUs = _u32(batch.infer_us)
        body.computeOutputUs = _u32(batch.output_us)
        body.execQueueUs = _u32(batch.exec_queue_us)
        body.dispatchedUnixNs = max(0, batch.dispatched_unix_ns)
        body.executorInUnixNs = max(0, batch.executor_in_unix_ns)
        body.executorDoneUnixNs = max(0, batch.done_unix_ns)
    return bytes(pack(body)[0])


def _u32(us: int) -> int:
    return max(0, min(us, 2**32 - 1))


def _nbytes(frame: Frame) -> int:
    return memoryview(buffer_of(frame)).nbytes


def check_payloads(tensors: Sequence[pb.TensorT] | None, frames: Sequence[Frame], what: str) -> None:
    """The tensors of a verified message against its payload frames: at most MAX_TENSORS, at most
    MAX_DIMS dimensions each, none negative; each in a frame that exists, is no other tensor's and
    holds exactly shape x itemsize bytes (fixed-size dtypes), or in shared memory (a region and a
    length under 1 TiB); and every frame is some tensor's. Raises ProtocolError("invalid")."""
    tensors = tensors or ()
    if len(tensors) > MAX_TENSORS:
        raise ProtocolError(f"{len(tensors)} {what} tensors; at most {MAX_TENSORS}", "invalid")
    used = [False] * len(frames)
    for i, t in enumerate(tensors):
        shape = t.shape or ()
        if len(shape) > MAX_DIMS:
            raise ProtocolError(f"{what} {i}: {len(shape)} dimensions; at most {MAX_DIMS}", "invalid")
        count = 1
        for d in shape:
            if d < 0:
                raise ProtocolError(f"{what} {i}: shape {list(shape)} has a negative dimension", "invalid")
            count *= d
        if t.frame < 0:
            if t.shm is None:
                raise ProtocolError(f"{what} {i}: no frame and no shared-memory reference", "invalid")
            if t.shm.length > MAX_SHM_BYTES:
                raise ProtocolError(f"{what} {i}: shm length {t.shm.length} is over 1 TiB", "invalid")
            continue
        if t.frame >= len(frames) or used[t.frame]:
            raise ProtocolError(
                f"{what} {i}: frame {t.frame} does not exist or is another tensor's "
                f"({len(frames)} payload frames)",
                "invalid",
            )
        used[t.frame] = True
        itemsize = ITEMSIZE[DTYPE_NAMES[t.dtype]]
        if itemsize and _nbytes(frames[t.frame]) != count * itemsize:
            raise ProtocolError(
                f"{what} {i}: frame holds {_nbytes(frames[t.frame])} bytes, shape {list(shape)} "
                f"needs {count} x {itemsize}",
                "invalid",
            )
    if not all(used):
        raise ProtocolError(
            f"{len(frames)} payload frames but only {sum(used)} belong to a tensor", "invalid"
        )


def request_tensor(t: pb.TensorT, frames: Sequence[Frame]) -> HostTensor:
    """A frame-backed tensor of a verified message as a HostTensor (no copy); TensorError if its
    frame is missing or its size disagrees with the shape."""
    if not 0 <= t.frame < len(frames):
        raise TensorError(f"tensor {t.name!r}: frame index {t.frame} outside 0..{len(frames) - 1}")
    return HostTensor.from_buffer(
        t.name or "", DTYPE_NAMES[t.dtype], tuple(t.shape or ()), buffer_of(frames[t.frame])
    )


def split_groups(frames: Sequence[Frame], counts: Sequence[int]) -> Iterator[list[Frame]]:
    """Cut the frames after a Batch/BatchResult envelope into per-request groups."""
    if sum(counts) != len(frames) or any(c < 1 for c in counts):
        raise ProtocolError(f"frame counts {list(counts)} do not add up to {len(frames)} frames", "invalid")
    pos = 0
    for count in counts:
        yield list(frames[pos : pos + count])
        pos += count


def bundle(groups: Sequence[Sequence[Frame]], *, responses: bool) -> list[Frame]:
    """One message for several [envelope, *payloads] groups (itself when there is one group)."""
    if len(groups) == 1:
        return list(groups[0])
    counts = [len(g) for g in groups]
    head = pb.BatchResultT(frameCounts=counts) if responses else pb.BatchT(frameCounts=counts)
    return pack(head, [frame for g in groups for frame in g])


def unbundle(parts: Sequence[Frame]) -> list[tuple[Any, list[Frame]]]:
    """The (body, [envelope, *payloads]) groups of one message: a bundle's groups, or the message
    itself. Each body is verified (`read`); a group whose envelope is refused carries the
    ProtocolError in place of its body, so one bad request spoils none of its neighbours and its
    id can still be looked for (`peek_request_ids`). A bundle whose counts do not add up raises."""
    if not parts:
        raise ProtocolError("empty message")
    try:
        body = read(parts[0])
    except ProtocolError as exc:
        return [(exc, list(parts))]
    if not (isinstance(body, pb.BatchT | pb.BatchResultT) and not body.batchId):
        return [(body, list(parts))]
    out: list[tuple[Any, list[Frame]]] = []
    for group in split_groups(parts[1:], body.frameCounts or ()):
        try:
            out.append((read(group[0]), group))
        except ProtocolError as exc:
            out.append((exc, group))
    return out
