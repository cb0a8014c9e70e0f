"""What goes into a slot and the REGISTER payload, written and read the same way by both sides.

    request   slot+0 header (INFER) | +16 InferMeta block | inputs at their offsets
    INFER_OK  slot+0 header         | +16 ResultMeta block | outputs at their offsets
    ERROR     slot+0 header (ERROR) | +16 UTF-8 message (payload_length bytes)
    REGISTER  (inline, after the header in the doorbell frame)
              u32 slot_bytes | u32 slot_count | u16 name length | name (ASCII) | API key (rest, UTF-8)

Writers put the payload first and the header last, then ring: a reader that sees the header in the
slot (or the doorbell) sees the payload too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from anvil_core.tensors import DATATYPES, decode_bytes_elements
from anvil_core.zerocopy import header as zh
from anvil_core.zerocopy import meta as zm
from anvil_core.zerocopy.header import Flag, Header, Op, Status, ZeroCopyError
from anvil_core.zerocopy.region import Region

__all__ = [
    "decode_register",
    "encode_register",
    "error_text",
    "read_outputs",
    "write_error",
    "write_request",
    "write_result",
]

_REGISTER = struct.Struct("<IIH")


def encode_register(slot_bytes: int, slot_count: int, name: str, api_key: str = "") -> bytes:
    raw = name.encode("ascii")
    return _REGISTER.pack(slot_bytes, slot_count, len(raw)) + raw + api_key.encode()


def decode_register(payload: bytes) -> tuple[int, int, str, str]:
    """(slot_bytes, slot_count, name, api_key); raises ZeroCopyError(BAD_REGION / BAD_LENGTH)."""
    if len(payload) < _REGISTER.size:
        raise ZeroCopyError(
            Status.BAD_LENGTH, "REGISTER payload: u32 slot_bytes, u32 slot_count, u16 n, name, key"
        )
    slot_bytes, slot_count, n = _REGISTER.unpack_from(payload)
    end = _REGISTER.size + n
    if end > len(payload):
        raise ZeroCopyError(Status.BAD_LENGTH, f"REGISTER name length {n} runs past the payload")
    try:
        return slot_bytes, slot_count, payload[_REGISTER.size : end].decode("ascii"), payload[end:].decode()
    except UnicodeDecodeError:
        raise ZeroCopyError(Status.BAD_REGION, "region name must be ASCII, the API key UTF-8") from None


def write_request(
    region: Region,
    slot: int,
    request_id: int,
    region_id: int,
    layout: tuple[bytes, tuple[zm.TensorDesc, ...], int],
    payloads: Sequence[Any],
) -> bytes:
    """Write an INFER into `slot` (block, inputs, header); returns the doorbell header."""
    block, descs, payload_length = layout
    if zh.HEADER_BYTES + payload_length > region.slot_bytes:
        raise ZeroCopyError(
            Status.BAD_LENGTH,
            f"request needs {zh.HEADER_BYTES + payload_length} bytes; slots hold {region.slot_bytes}",
        )
    base = region.slot_offset(slot)
    region.set(base + zh.HEADER_BYTES, block)
    for desc, data in zip(descs, payloads, strict=True):
        region.set(base + desc.offset, data)
    head = zh.encode(request_id, Op.INFER, payload_length, Flag.META, 0, zh.pack_reserved(region_id, slot))
    region.set(base, head)
    return head


def write_result(
    region: Region, base: int, request_id: int, reserved: int, layout: zm.ResultLayout,
    buffers: Sequence[Any], queue_us: int, compute_us: int,
) -> bytes:  # fmt: skip
    """Write an INFER_OK (block, outputs, header) into the slot at `base`; returns the header."""
    need = zh.HEADER_BYTES + layout.payload_length
    if need > region.slot_bytes:
        raise ZeroCopyError(
            Status.TOO_LARGE, f"results need {need} bytes; the slot holds {region.slot_bytes}"
        )
    region.set(base + zh.HEADER_BYTES, layout.block_with(queue_us, compute_us))
    for desc, buf in zip(layout.outputs, buffers, strict=True):
        region.set(base + desc.offset, buf)
    head = zh.encode(request_id, Op.INFER_OK, layout.payload_length, Flag.META, 0, reserved)
    region.set(base, head)
    return head


def write_error(
    region: Region, base: int, request_id: int, reserved: int, status: Status, text: str
) -> bytes:
    """Write an ERROR with its message into the slot at `base`; returns the header."""
    body = text.encode()[: region.slot_bytes - zh.HEADER_BYTES]
    region.set(base + zh.HEADER_BYTES, body)
    head = zh.encode(request_id, Op.ERROR, len(body), 0, status, reserved)
    region.set(base, head)
    return head


def error_text(region: Region, slot: int | None, head: Header, inline: bytes) -> str:
    """The message of an ERROR reply: inline (flag INLINE) or in the slot."""
    if head.flags & Flag.INLINE or slot is None:
        return inline.decode(errors="replace")
    base = region.slot_offset(slot)
    length = min(head.payload_length, region.slot_bytes - zh.HEADER_BYTES)
    return bytes(region.get(base + zh.HEADER_BYTES, length)).decode(errors="replace")


def read_outputs(
    region: Region, slot: int, head: Header, copy: bool = True
) -> tuple[zm.ResultMeta, dict[str, np.ndarray]]:
    """The ResultMeta and outputs of an INFER_OK in `slot` (copies unless `copy=False`: then the
    arrays view the slot and are valid until it is reused)."""
    base = region.check_payload(slot, head.payload_length)
    payload = region.get(base + zh.HEADER_BYTES, head.payload_length)
    result = zm.decode_result(zm.read_block(payload, head.payload_length))
    out: dict[str, np.ndarray] = {}
    for t in result.outputs:
        if t.offset + t.length > zh.HEADER_BYTES + head.payload_length:
            raise ZeroCopyError(Status.PROTOCOL, f"output {t.name!r} extends past the reply")
        dtype = DATATYPES[t.datatype]
        if dtype is None:
            count = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
            items = decode_bytes_elements(region.get(base + t.offset, t.length), count)
            out[t.name] = np.array(items, dtype=object).reshape(t.shape)
            continue
        arr = region.array(base + t.offset, dtype, t.shape)
        out[t.name] = arr.copy() if copy else arr
    return result, out
