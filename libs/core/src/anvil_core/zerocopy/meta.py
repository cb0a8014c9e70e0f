"""The metadata block at the start of a slot's payload (proto/zerocopy.fbs), through the wire codec.

A block is size-prefixed: ``u32 LE n`` then an n-byte flatbuffer (InferMeta from the client,
ResultMeta from the gateway). Tensor bytes follow at 64-byte aligned offsets counted from the first
byte of the slot::

    slot+0    16 B  header
    slot+16    4 B  n
    slot+20    n B  InferMeta / ResultMeta
              pad   to a multiple of 64
    slot+a         tensor bytes (a = SlotTensor.offset), ... up to slot+16+payload_length

`read_block` copies the (small) block out of shared memory before it is parsed, so a client that
rewrites its slot mid-parse cannot make the checked and the used metadata differ. The codec's
verifier checks the flatbuffer itself (offsets, strings, enums, the schema's constraints); the
checks here are the slot's (offsets, lengths, counts, names). Decoding untrusted bytes raises only
`MetaError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core import codec
from anvil_core.codec import DTYPE_CODES, DTYPE_NAMES, ITEMSIZE, ProtocolError, zpb
from anvil_core.zerocopy.header import HEADER_BYTES, Status, ZeroCopyError

__all__ = [
    "DATA_ALIGN",
    "META_VERSION",
    "InferMeta",
    "MetaError",
    "ResultLayout",
    "ResultMeta",
    "TensorDesc",
    "align",
    "decode_infer",
    "decode_result",
    "encode_infer",
    "encode_result",
    "plan",
    "read_block",
    "result_layout",
]

META_VERSION = 1
DATA_ALIGN = 64
MAX_TENSORS = 64
MAX_RANK = 16
MAX_META_BYTES = 64 * 1024
_PREFIX = struct.Struct("<I")


class MetaError(ZeroCopyError):
    """A metadata block that is undecodable or breaks a rule; the message states which."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.BAD_META, message)


@dataclass(frozen=True, slots=True)
class TensorDesc:
    name: str
    datatype: str  # KServe name: FP32, INT64, BYTES, ...
    shape: tuple[int, ...]
    offset: int  # bytes from the slot's first byte; a multiple of DATA_ALIGN
    length: int  # bytes


@dataclass(frozen=True, slots=True)
class InferMeta:
    model: str
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[str, ...] = ()
    model_version: str = ""
    priority: int = 0
    timeout_us: int = 0
    trace_id: str = ""

    @property
    def end(self) -> int:
        """First slot byte after every input (what 16 + payload_length must cover)."""
        return max((t.offset + t.length for t in self.inputs), default=0)


@dataclass(frozen=True, slots=True)
class ResultMeta:
    model: str
    outputs: tuple[TensorDesc, ...]
    model_version: str = ""
    queue_us: int = 0
    compute_us: int = 0


@dataclass(frozen=True, slots=True)
class ResultLayout:
    """A reply's slot layout for one output shape set, planned once and reused: per response the
    block is written again with that response's timings (same size: the writer's sizes never
    depend on numbers)."""

    model: str
    model_version: str
    outputs: tuple[TensorDesc, ...]
    payload_length: int

    def block_with(self, queue_us: int, compute_us: int) -> bytes:
        return encode_result(ResultMeta(self.model, self.outputs, self.model_version, queue_us, compute_us))


def align(n: int) -> int:
    return (n + DATA_ALIGN - 1) // DATA_ALIGN * DATA_ALIGN


def data_start(block: bytes) -> int:
    """Slot offset of the first tensor byte after a size-prefixed `block` (from encode_*)."""
    return align(HEADER_BYTES + len(block))


def expected_length(datatype: str, shape: Sequence[int]) -> int:
    """Bytes of a fixed-size tensor; for BYTES the minimum (one u32 length per element)."""
    count = 1
    for d in shape:
        count *= d
    return count * (ITEMSIZE[datatype] or 4)


def plan(
    block_for: Callable[[tuple[TensorDesc, ...]], bytes],
    tensors: Sequence[tuple[str, str, tuple[int, ...], int]],
) -> tuple[bytes, tuple[TensorDesc, ...], int]:
    """Lay out a slot: (size-prefixed block, tensors with their offsets, payload_length).

    `tensors` are (name, datatype, shape, length); `block_for` encodes the block for given
    descriptors. Two passes: the block is sized with zero offsets (its size does not depend on
    them), then built with the real ones. Tensors follow the block, each 64-byte aligned.
    """
    sized = block_for(tuple(TensorDesc(n, dt, sh, 0, ln) for n, dt, sh, ln in tensors))
    pos = data_start(sized)
    descs: list[TensorDesc] = []
    for name, datatype, shape, length in tensors:
        descs.append(TensorDesc(name, datatype, shape, pos, length))
        pos = align(pos + length)
    block = block_for(tuple(descs))
    assert len(block) == len(sized), "metadata size must not depend on offset values"
    end = max([HEADER_BYTES + len(block)] + [t.offset + t.length for t in descs])
    return block, tuple(descs), end - HEADER_BYTES


def result_layout(
    model: str, model_version: str, tensors: Sequence[tuple[str, str, tuple[int, ...], int]]
) -> ResultLayout:
    """Plan a reply (see `plan`): where each output goes, and the payload length."""
    _, descs, payload_length = plan(lambda d: encode_result(ResultMeta(model, d, model_version)), tensors)
    return ResultLayout(model, model_version, descs, payload_length)


# ---- encode -----------------------------------------------------------------------------------
def _slot_tensor(t: TensorDesc) -> Any:
    return zpb.SlotTensorT(
        name=t.name, dtype=DTYPE_CODES[t.datatype], shape=t.shape, offset=t.offset, length=t.length
    )


def encode_infer(meta: InferMeta) -> bytes:
    """Size-prefixed InferMeta. Its size does not depend on the offset values (the codec writes
    every scalar), so a client can size the block with placeholder offsets, then fill in the real ones."""
    obj = zpb.InferMetaT(
        version=META_VERSION,
        model=meta.model,
        modelVersion=meta.model_version,
        priority=meta.priority,
        timeoutUs=meta.timeout_us,
        traceId=meta.trace_id,
        inputs=[_slot_tensor(t) for t in meta.inputs],
        outputs=list(meta.outputs),
    )
    return codec.encode_table(obj, size_prefixed=True)


def encode_result(meta: ResultMeta) -> bytes:
    """Size-prefixed ResultMeta (same size rule as `encode_infer`)."""
    obj = zpb.ResultMetaT(
        version=META_VERSION,
        model=meta.model,
        modelVersion=meta.model_version,
        queueUs=min(max(meta.queue_us, 0), 0xFFFF_FFFF),
        computeUs=min(max(meta.compute_us, 0), 0xFFFF_FFFF),
        outputs=[_slot_tensor(t) for t in meta.outputs],
    )
    return codec.encode_table(obj, size_prefixed=True)


# ---- decode -----------------------------------------------------------------------------------
def read_block(payload: memoryview | bytes, payload_length: int) -> bytes:
    """Copy the size-prefixed block at the start of a payload out of shared memory (prefix
    included, so the result can be used as a cache key and fed to `decode_*`)."""
    if payload_length < _PREFIX.size or len(payload) < _PREFIX.size:
        raise MetaError(f"payload of {payload_length} bytes has no room for a metadata block")
    (n,) = _PREFIX.unpack_from(payload, 0)
    if n > MAX_META_BYTES or _PREFIX.size + n > min(payload_length, len(payload)):
        raise MetaError(f"metadata block of {n} bytes overruns the payload ({payload_length} bytes)")
    return bytes(payload[: _PREFIX.size + n])


def _descs(tensors: Sequence[Any] | None, block_end: int, what: str) -> tuple[TensorDesc, ...]:
    tensors = tensors or ()
    if len(tensors) > MAX_TENSORS:
        raise MetaError(f"{len(tensors)} {what} declared; at most {MAX_TENSORS}")
    out: list[TensorDesc] = []
    seen: set[str] = set()
    for j, t in enumerate(tensors):
        name = t.name
        if name in seen:
            raise MetaError(f"{what}[{j}] needs a unique name; {name!r} repeats")
        seen.add(name)
        datatype = DTYPE_NAMES[t.dtype]  # verified by the codec
        shape = tuple(t.shape or ())
        if len(shape) > MAX_RANK:
            raise MetaError(f"{what}[{j}] ({name}): rank {len(shape)} above {MAX_RANK}")
        if any(d < 0 or d > 0xFFFF_FFFF for d in shape):
            raise MetaError(f"{what}[{j}] ({name}): dims must be in 0..2^32-1, got {list(shape)}")
        offset, length = t.offset, t.length
        if offset % DATA_ALIGN or offset < block_end:
            raise MetaError(
                f"{what}[{j}] ({name}): offset {offset} must be a multiple of {DATA_ALIGN} "
                f"at or after the metadata's end ({block_end})"
            )
        need = expected_length(datatype, shape)
        if (datatype != "BYTES" and length != need) or length < need:
            raise MetaError(
                f"{what}[{j}] ({name}): {length} bytes, but shape {list(shape)} of {datatype} needs {need}"
            )
        out.append(TensorDesc(name, datatype, shape, offset, length))
    return tuple(out)


def _decode(block: bytes, name: str, who: str) -> Any:
    if len(block) < _PREFIX.size:
        raise MetaError(f"{name} block of {len(block)} bytes has no size prefix")
    try:
        m = codec.decode_table(
            block, name, _PREFIX.size, min(len(block), _PREFIX.size + _PREFIX.unpack_from(block)[0])
        )
    except ProtocolError as exc:
        raise MetaError(f"metadata block refused: {exc}") from None
    if m.version != META_VERSION:
        raise MetaError(f"metadata version {m.version}; this {who} reads {META_VERSION}")
    return m


def decode_infer(block: bytes) -> InferMeta:
    """Parse and check a size-prefixed InferMeta (from `read_block`). Raises MetaError."""
    m = _decode(block, "InferMeta", "gateway")
    inputs = _descs(m.inputs, HEADER_BYTES + len(block), "inputs")
    if not inputs:
        raise MetaError("an INFER needs at least one input")
    outputs = tuple(m.outputs or ())
    if len(outputs) > MAX_TENSORS:
        raise MetaError(f"{len(outputs)} outputs requested; at most {MAX_TENSORS}")
    return InferMeta(
        model=m.model,
        inputs=inputs,
        outputs=outputs,
        model_version=m.modelVersion or "",
        priority=m.priority,
        timeout_us=m.timeoutUs,
        trace_id=m.traceId or "",
    )


def decode_result(block: bytes) -> ResultMeta:
    """Parse and check a size-prefixed ResultMeta (client side). Raises MetaError."""
    m = _decode(block, "ResultMeta", "client")
    return ResultMeta(
        model=m.model or "",
        outputs=_descs(m.outputs, HEADER_BYTES + len(block), "outputs"),
        model_version=m.modelVersion or "",
        queue_us=m.queueUs,
        compute_us=m.computeUs,
    )
