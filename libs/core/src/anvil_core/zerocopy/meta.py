"""Codec of the metadata block at the start of a slot's payload (proto/zerocopy.fbs).

A block is size-prefixed: ``u32 LE n`` then an n-byte flatbuffer (InferMeta from the client,
ResultMeta from the gateway). Tensor bytes follow at 64-byte aligned offsets counted from the first
byte of the slot::

    slot+0    16 B  header
    slot+16    4 B  n
    slot+20    n B  InferMeta / ResultMeta
              pad   to a multiple of 64
    slot+a         tensor bytes (a = SlotTensor.offset), ... up to slot+16+payload_length

`read_block` copies the (small) block out of shared memory before it is parsed, so a client that
rewrites its slot mid-parse cannot make the checked and the used metadata differ. Decoding untrusted
bytes raises only `MetaError`; every count is bounded before it is iterated.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import flatbuffers
import numpy as np

from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.proto_gen import zerocopy_generated as zpb
from anvil_core.tensors import DATATYPES
from anvil_core.zerocopy.header import HEADER_BYTES, Status, ZeroCopyError

__all__ = [
    "DATA_ALIGN",
    "META_VERSION",
    "InferMeta",
    "MetaError",
    "ResultLayout",
    "ResultMeta",
    "ResultReader",
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
MAX_NAME = 256  # bytes of any name or id
MAX_META_BYTES = 64 * 1024
_PREFIX = struct.Struct("<I")
_CODES: dict[str, int] = {name: getattr(pb.DType, name) for name in DATATYPES}
_NAMES: dict[int, str] = {code: name for name, code in _CODES.items()}
_ITEMSIZE: dict[str, int] = {n: (dt.itemsize if dt is not None else 0) for n, dt in DATATYPES.items()}


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
    """A reply's slot layout for one output shape set, built once and reused: per response only the
    two timing scalars are patched into a copy of `block` (a flatbuffer build costs ~100 µs in
    Python; a patch ~1 µs)."""

    block: bytes  # size-prefixed ResultMeta with queue_us = compute_us = 0
    outputs: tuple[TensorDesc, ...]
    payload_length: int
    queue_pos: int  # byte positions of the u32 scalars inside `block`
    compute_pos: int

    def block_with(self, queue_us: int, compute_us: int) -> bytearray:
        out = bytearray(self.block)
        _PREFIX.pack_into(out, self.queue_pos, min(max(queue_us, 0), 0xFFFF_FFFF))
        _PREFIX.pack_into(out, self.compute_pos, min(max(compute_us, 0), 0xFFFF_FFFF))
        return out


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
    return count * (_ITEMSIZE[datatype] or 4)


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
    """Plan a reply (see `plan`) and locate its timing scalars for `ResultLayout.block_with`."""
    block, descs, payload_length = plan(
        lambda d: encode_result(ResultMeta(model, d, model_version, 0, 0)), tensors
    )
    table = zpb.ResultMeta.GetRootAs(block, _PREFIX.size)._tab
    # vtable slots of queue_us and compute_us (fields 3 and 4); ForceDefaults keeps both present
    queue_pos, compute_pos = table.Pos + table.Offset(10), table.Pos + table.Offset(12)
    return ResultLayout(block, descs, payload_length, queue_pos, compute_pos)


# ---- encode -----------------------------------------------------------------------------------
def _tensor(b: flatbuffers.Builder, t: TensorDesc) -> int:
    name = b.CreateString(t.name)
    shape = b.CreateNumpyVector(np.asarray(t.shape, dtype=np.int64))
    zpb.SlotTensorStart(b)
    zpb.SlotTensorAddName(b, name)
    zpb.SlotTensorAddDtype(b, _CODES[t.datatype])
    zpb.SlotTensorAddShape(b, shape)
    zpb.SlotTensorAddOffset(b, t.offset)
    zpb.SlotTensorAddLength(b, t.length)
    return int(zpb.SlotTensorEnd(b))


def _vector(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return int(b.EndVector())


def encode_infer(meta: InferMeta) -> bytes:
    """Size-prefixed InferMeta. ForceDefaults keeps the size independent of the offset values, so a
    client can size the block with placeholder offsets and then fill in the real ones."""
    b = flatbuffers.Builder(256 + 96 * len(meta.inputs))
    b.ForceDefaults(True)
    inputs = _vector(b, [_tensor(b, t) for t in meta.inputs])
    outputs = _vector(b, [b.CreateString(o) for o in meta.outputs])
    model, version, trace = (b.CreateString(s) for s in (meta.model, meta.model_version, meta.trace_id))
    zpb.InferMetaStart(b)
    zpb.InferMetaAddVersion(b, META_VERSION)
    zpb.InferMetaAddModel(b, model)
    zpb.InferMetaAddModelVersion(b, version)
    zpb.InferMetaAddPriority(b, meta.priority)
    zpb.InferMetaAddTimeoutUs(b, meta.timeout_us)
    zpb.InferMetaAddTraceId(b, trace)
    zpb.InferMetaAddInputs(b, inputs)
    zpb.InferMetaAddOutputs(b, outputs)
    b.FinishSizePrefixed(zpb.InferMetaEnd(b))
    return bytes(b.Output())


def encode_result(meta: ResultMeta) -> bytes:
    """Size-prefixed ResultMeta (same ForceDefaults rule as `encode_infer`)."""
    b = flatbuffers.Builder(256 + 96 * len(meta.outputs))
    b.ForceDefaults(True)
    outputs = _vector(b, [_tensor(b, t) for t in meta.outputs])
    model, version = b.CreateString(meta.model), b.CreateString(meta.model_version)
    zpb.ResultMetaStart(b)
    zpb.ResultMetaAddVersion(b, META_VERSION)
    zpb.ResultMetaAddModel(b, model)
    zpb.ResultMetaAddModelVersion(b, version)
    zpb.ResultMetaAddQueueUs(b, min(max(meta.queue_us, 0), 0xFFFF_FFFF))
    zpb.ResultMetaAddComputeUs(b, min(max(meta.compute_us, 0), 0xFFFF_FFFF))
    zpb.ResultMetaAddOutputs(b, outputs)
    b.FinishSizePrefixed(zpb.ResultMetaEnd(b))
    return bytes(b.Output())


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


def _text(raw: bytes | None, what: str) -> str:
    if raw is None:
        return ""
    if len(raw) > MAX_NAME:
        raise MetaError(f"{what} is longer than {MAX_NAME} bytes")
    return raw.decode()


def _descs(count: int, get: object, block_end: int, what: str) -> tuple[TensorDesc, ...]:
    if count > MAX_TENSORS:
        raise MetaError(f"{count} {what} declared; at most {MAX_TENSORS}")
    out: list[TensorDesc] = []
    seen: set[str] = set()
    for j in range(count):
        t = get(j)  # type: ignore[operator]
        name = _text(t.Name(), f"{what}[{j}].name")
        if not name or name in seen:
            raise MetaError(f"{what}[{j}] needs a unique, non-empty name")
        seen.add(name)
        datatype = _NAMES.get(t.Dtype())
        if datatype is None:
            raise MetaError(f"{what}[{j}] ({name}): unknown dtype code {t.Dtype()}")
        rank = t.ShapeLength()
        if rank > MAX_RANK:
            raise MetaError(f"{what}[{j}] ({name}): rank {rank} above {MAX_RANK}")
        shape = tuple(int(d) for d in t.ShapeAsNumpy().tolist()) if rank else ()
        if any(d < 0 or d > 0xFFFF_FFFF for d in shape):
            raise MetaError(f"{what}[{j}] ({name}): dims must be in 0..2^32-1, got {list(shape)}")
        offset, length = t.Offset(), t.Length()
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


def decode_infer(block: bytes) -> InferMeta:
    """Parse and check a size-prefixed InferMeta (from `read_block`). Raises MetaError."""
    block_end = HEADER_BYTES + len(block)
    try:
        m = zpb.InferMeta.GetRootAs(block, _PREFIX.size)
        if m.Version() != META_VERSION:
            raise MetaError(f"metadata version {m.Version()}; this gateway reads {META_VERSION}")
        model = _text(m.Model(), "model")
        if not model:
            raise MetaError("model name is empty")
        priority = m.Priority()
        if priority > 3:
            raise MetaError(f"priority {priority} outside 0 (default), 1..3")
        inputs = _descs(m.InputsLength(), m.Inputs, block_end, "inputs")
        if not inputs:
            raise MetaError("an INFER needs at least one input")
        n_out = m.OutputsLength()
        if n_out > MAX_TENSORS:
            raise MetaError(f"{n_out} outputs requested; at most {MAX_TENSORS}")
        outputs = tuple(_text(m.Outputs(j), f"outputs[{j}]") for j in range(n_out))
        return InferMeta(
            model=model,
            inputs=inputs,
            outputs=outputs,
            model_version=_text(m.ModelVersion(), "model_version"),
            priority=priority,
            timeout_us=m.TimeoutUs(),
            trace_id=_text(m.TraceId(), "trace_id"),
        )
    except MetaError:
        raise
    except Exception as exc:  # flatbuffers reads garbage as struct/index/unicode/value errors
        raise MetaError(f"undecodable metadata block ({type(exc).__name__})") from None


def decode_result(block: bytes) -> ResultMeta:
    """Parse and check a size-prefixed ResultMeta (client side). Raises MetaError."""
    block_end = HEADER_BYTES + len(block)
    try:
        m = zpb.ResultMeta.GetRootAs(block, _PREFIX.size)
        if m.Version() != META_VERSION:
            raise MetaError(f"result metadata version {m.Version()}; this client reads {META_VERSION}")
        return ResultMeta(
            model=_text(m.Model(), "model"),
            outputs=_descs(m.OutputsLength(), m.Outputs, block_end, "outputs"),
            model_version=_text(m.ModelVersion(), "model_version"),
            queue_us=m.QueueUs(),
            compute_us=m.ComputeUs(),
        )
    except MetaError:
        raise
    except Exception as exc:
        raise MetaError(f"undecodable result block ({type(exc).__name__})") from None


class ResultReader:
    """Decodes ResultMeta blocks, memoized on everything but the two timing scalars (replies to
    requests of one shape differ only there), so a client pays the ~80 µs decode once per shape."""

    def __init__(self, entries: int = 1024) -> None:
        self._cache: dict[bytes, ResultMeta] = {}
        self._entries = entries

    def read(self, block: bytes) -> ResultMeta:
        try:
            table = zpb.ResultMeta.GetRootAs(block, _PREFIX.size)._tab
            q, c = table.Offset(10), table.Offset(12)
        except Exception as exc:
            raise MetaError(f"undecodable result block ({type(exc).__name__})") from None
        qp, cp = table.Pos + q, table.Pos + c
        if not (q and c and qp + 4 <= len(block) and cp + 4 <= len(block)):
            return decode_result(block)
        (queue_us,), (compute_us,) = _PREFIX.unpack_from(block, qp), _PREFIX.unpack_from(block, cp)
        key = bytearray(block)
        key[qp : qp + 4] = key[cp : cp + 4] = bytes(4)
        base = self._cache.get(bytes(key))
        if base is None:
            if len(self._cache) >= self._entries:
                self._cache.clear()
            base = self._cache[bytes(key)] = decode_result(bytes(key))
        return replace(base, queue_us=queue_us, compute_us=compute_us)
