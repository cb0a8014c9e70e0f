"""The InferRequest envelope a ZeroCopy INFER becomes (built once, patched per request), and the
outputs of the InferResponse that comes back.

Building a flatbuffer in Python costs ~150 µs (a thousand interpreted builder calls). Requests of one
client repeat the same metadata, so the gateway builds the envelope once per (metadata block, region,
priority) with `infer_codec.build_request` (the single codec) and then, per request, copies it and
overwrites the fields that vary in place: request id, trace id, deadline and the inputs' shm offsets.
Every patched field has a fixed width in the template (ids are fixed-length, scalars are written with
non-default placeholders so flatbuffers cannot elide them), so the patched buffer is exactly what
`build_request` would have produced with the real values; a test checks this.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core import infer_codec as codec
from anvil_core.proto_gen import anvil_generated as pb
from anvil_core.tensors import DATATYPES
from anvil_core.zerocopy.header import Status, ZeroCopyError

__all__ = ["ID_CHARS", "EnvelopeTemplate", "response_outputs"]

ID_CHARS = 32  # request id and trace id width: 32 lowercase hex digits
_PLACEHOLDER_ID = "f" * ID_CHARS
_PLACEHOLDER_NS = 1  # non-zero: the deadline field must be present to be patched
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# vtable offsets (4 + 2 * field index) in proto/anvil.fbs
_REQUEST_ID, _TRACE_ID, _DEADLINE, _INPUTS = 4, 6, 14, 18
_TENSOR_SHM, _SHM_OFFSET = 12, 6
_DTYPES = {getattr(pb.DType, name): name for name in DATATYPES}


def _field(tab: object, vt: int) -> int:
    """Absolute position of a present field (raises if the builder elided it)."""
    o = tab.Offset(vt)  # type: ignore[attr-defined]
    if not o:
        raise ValueError(f"field at vtable offset {vt} is absent from the template")
    return int(tab.Pos + o)  # type: ignore[attr-defined]


def _string(buf: bytes, tab: object, vt: int, width: int) -> int:
    """Position of the first character of a string field of `width` bytes."""
    pos = _field(tab, vt)
    start = pos + _U32.unpack_from(buf, pos)[0]
    if _U32.unpack_from(buf, start)[0] != width:
        raise ValueError("template string has the wrong width")
    return start + 4


@dataclass(frozen=True, slots=True)
class EnvelopeTemplate:
    template: bytes
    request_id_pos: int
    trace_id_pos: int  # -1: the trace id is fixed (the client chose it)
    deadline_pos: int
    offset_pos: tuple[int, ...]  # per shm input, position of ShmRef.offset
    base_offsets: tuple[int, ...]  # per shm input, its offset relative to the slot

    @classmethod
    def build(
        cls,
        *,
        model: str,
        version: str,
        priority: int,
        tenant: str,
        trace_id: str,
        region: str,
        inputs: Sequence[tuple[str, str, tuple[int, ...], int, int]],
        outputs: Sequence[str],
    ) -> EnvelopeTemplate:
        """`inputs` are (name, datatype, shape, offset within the slot, length); `trace_id` empty
        means one is patched in per request."""
        spans = [
            (name, dt, shape, codec.ShmSpan(region, 1 + off, length))  # 1+: never the default 0
            for name, dt, shape, off, length in inputs
        ]
        raw = codec.build_request(
            request_id=_PLACEHOLDER_ID,
            trace_id=trace_id or _PLACEHOLDER_ID,
            model=model,
            version=version,
            priority=priority,
            deadline_unix_ns=_PLACEHOLDER_NS,
            tenant=tenant,
            shm_inputs=spans,
            outputs=outputs,
        )
        req = codec.open_request(raw)
        tab = req._tab
        offsets = []
        for j in range(req.InputsLength()):
            shm = req.Inputs(j).Shm()
            offsets.append(_field(shm._tab, _SHM_OFFSET))
        return cls(
            template=raw,
            request_id_pos=_string(raw, tab, _REQUEST_ID, ID_CHARS),
            trace_id_pos=-1 if trace_id else _string(raw, tab, _TRACE_ID, ID_CHARS),
            deadline_pos=_field(tab, _DEADLINE),
            offset_pos=tuple(offsets),
            base_offsets=tuple(off for _, _, _, off, _ in inputs),
        )

    def fill(self, request_id: bytes, trace_id: bytes, deadline_unix_ns: int, slot_base: int) -> bytearray:
        """The envelope for one request; ids are ID_CHARS ASCII bytes, `slot_base` the slot's
        offset in the region (each input's ShmRef.offset becomes slot_base + its slot offset)."""
        out = bytearray(self.template)
        out[self.request_id_pos : self.request_id_pos + ID_CHARS] = request_id
        if self.trace_id_pos >= 0:
            out[self.trace_id_pos : self.trace_id_pos + ID_CHARS] = trace_id
        _I64.pack_into(out, self.deadline_pos, deadline_unix_ns)
        for pos, off in zip(self.offset_pos, self.base_offsets, strict=True):
            _U64.pack_into(out, pos, slot_base + off)
        return out


def response_outputs(
    resp: pb.InferResponse, frames: Sequence[Any]
) -> tuple[list[tuple[str, str, tuple[int, ...], int]], list[memoryview]]:
    """(name, datatype, shape, bytes) per output and the frame buffers that hold them (no copy)."""
    tensors, buffers = [], []
    for j in range(resp.OutputsLength()):
        t = resp.Outputs(j)
        datatype, index = _DTYPES.get(t.Dtype()), t.Frame()
        if datatype is None or not 0 <= index < len(frames):
            raise ZeroCopyError(Status.INTERNAL, f"malformed output {j} from the executor")
        raw = frames[index]
        buf = raw.buffer if hasattr(raw, "buffer") else memoryview(raw)
        shape = tuple(t.ShapeAsNumpy().tolist()) if t.ShapeLength() else ()
        tensors.append(((t.Name() or b"").decode(), datatype, shape, buf.nbytes))
        buffers.append(buf)
    return tensors, buffers
