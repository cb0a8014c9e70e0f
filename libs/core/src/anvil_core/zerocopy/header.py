"""The ZeroCopy doorbell header: 16 bytes, little-endian, ``struct '<IHIHI'`` (docs/protocol.md).

    offset  size  field            requests                         replies
    0       4     request_id       chosen by the client, unique     echoed
                                   among its requests in flight
    4       2     op_code          an Op below                      request op | 0x8000, or ERROR
    6       4     payload_length   bytes after the header (in the   bytes after the header
                                   slot; inline for REGISTER)
    10      2     metadata_flag    low byte: Flag bits              low byte: Flag bits
                                   high byte: 0                     high byte: Status (0 = OK)
    12      4     reserved         INFER/UNREGISTER: region << 16 | slot; CANCEL: target request id;
                                   REGISTER/PING: 0.   Replies: REGISTER_OK carries region << 16.

Everything here is pure and allocation-light: the gateway decodes one header per request with the
precompiled `HEADER` struct and a handful of integer comparisons. Every way a header can be wrong is
a `HeaderError` carrying the Status to answer with; nothing else is ever raised by `decode_*`.
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "MAX_INLINE_BYTES",
    "REPLY_BIT",
    "Flag",
    "Header",
    "HeaderError",
    "Op",
    "Status",
    "ZeroCopyError",
    "decode_reply",
    "decode_request",
    "encode",
    "pack_reserved",
    "peek_request_id",
]

HEADER = struct.Struct("<IHIHI")
HEADER_BYTES = HEADER.size  # 16
REPLY_BIT = 0x8000
# Largest payload carried inside the doorbell frame itself (REGISTER; ERROR text without a slot).
MAX_INLINE_BYTES = 1024
_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF


class Op(IntEnum):
    """Op codes. A reply is its request's code with REPLY_BIT set; ERROR answers any request."""

    REGISTER = 0x0001  # inline payload: u32 slot_bytes, u32 slot_count, region name (ASCII)
    UNREGISTER = 0x0002  # reserved: region << 16; answered once the region's requests are done
    INFER = 0x0003  # reserved: region << 16 | slot; payload in the slot
    PING = 0x0004
    CANCEL = 0x0005  # reserved: the request id to cancel
    REGISTER_OK = REGISTER | REPLY_BIT  # reserved: region << 16
    UNREGISTER_OK = UNREGISTER | REPLY_BIT
    INFER_OK = INFER | REPLY_BIT  # results are in the slot
    PONG = PING | REPLY_BIT
    CANCEL_OK = CANCEL | REPLY_BIT  # the target was in flight and got its one answer: CANCELLED
    ERROR = 0xFFFF  # status in the high byte of metadata_flag; text in the slot or inline


REQUEST_OPS = frozenset({Op.REGISTER, Op.UNREGISTER, Op.INFER, Op.PING, Op.CANCEL})
REPLY_OPS = frozenset({Op.REGISTER_OK, Op.UNREGISTER_OK, Op.INFER_OK, Op.PONG, Op.CANCEL_OK, Op.ERROR})


class Flag(IntFlag):
    """Low byte of metadata_flag. Unknown bits are refused, so they can be given meaning later."""

    META = 0x01  # the payload starts with a size-prefixed flatbuffer (InferMeta / ResultMeta)
    INLINE = 0x02  # the payload follows the header inside the doorbell frame, not in a slot


FLAG_BITS = int(Flag.META | Flag.INLINE)


class Status(IntEnum):
    """High byte of metadata_flag in replies. 1..8 are anvil.proto.ErrorCode values."""

    OK = 0
    BAD_REQUEST = 1  # inputs do not fit the model (dtype, shape, names)
    NOT_FOUND = 2  # unknown model/version; CANCEL of a request that is not in flight
    UNAVAILABLE = 3  # no scheduler/executor, or the registry is unreachable
    DEADLINE = 4  # shed or timed out
    OVERLOAD = 5
    INTERNAL = 6
    PROTOCOL = 7
    CANCELLED = 8  # the request was cancelled by a CANCEL
    BAD_HEADER = 32  # truncated/oversized frame, unknown flag bits, a status in a request
    BAD_OP = 33  # unknown op code, or a reply op sent as a request
    BAD_REGION = 34  # region not registered (by this connection), closing, or refused at REGISTER
    BAD_SLOT = 35  # slot index beyond the region, or the slot's header is not the doorbell's
    BAD_LENGTH = 36  # payload_length beyond the slot (or the inline limit), or a span outside it
    BAD_META = 37  # metadata block undecodable or inconsistent
    SLOT_BUSY = 38  # the slot has a request in flight
    DUPLICATE = 39  # the request id is already in flight on this connection
    TOO_LARGE = 40  # the results do not fit the slot
    UNAUTHORIZED = 41  # REGISTER without a (known) API key where the gateway requires one


class ZeroCopyError(Exception):
    """Base of every ZeroCopy failure; `status` is what the reply carries."""

    def __init__(self, status: Status, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.request_id = request_id

    @property
    def message(self) -> str:
        return str(self.args[0])


class HeaderError(ZeroCopyError):
    """A header that cannot be accepted; answered with ERROR(status) for `request_id`."""


class Header(NamedTuple):
    request_id: int
    op: int
    payload_length: int
    metadata_flag: int
    reserved: int

    @property
    def flags(self) -> int:
        return self.metadata_flag & 0xFF

    @property
    def status(self) -> int:
        return self.metadata_flag >> 8

    @property
    def region(self) -> int:
        return self.reserved >> 16

    @property
    def slot(self) -> int:
        return self.reserved & _U16


def pack_reserved(region: int, slot: int) -> int:
    if not (0 <= region <= _U16 and 0 <= slot <= _U16):
        raise HeaderError(Status.BAD_HEADER, f"region {region} and slot {slot} must each fit 16 bits")
    return region << 16 | slot


def encode(
    request_id: int,
    op: int,
    payload_length: int = 0,
    flags: int = 0,
    status: int = 0,
    reserved: int = 0,
) -> bytes:
    """16 header bytes; raises HeaderError when a field does not fit its width."""
    if flags & ~0xFF or not 0 <= status <= 0xFF:
        raise HeaderError(Status.BAD_HEADER, f"flags {flags:#x} / status {status} exceed a byte")
    try:
        return HEADER.pack(request_id, op, payload_length, status << 8 | flags, reserved)
    except struct.error as exc:
        raise HeaderError(Status.BAD_HEADER, f"header field out of range: {exc}") from None


def peek_request_id(frame: bytes) -> int:
    """The request id of a frame too short to be a header (0 when even that is missing)."""
    return int.from_bytes(frame[:4], "little") if len(frame) >= 4 else 0


def decode_request(frame: bytes) -> Header:
    """Parse and check a doorbell frame sent by a client.

    Context-free checks only (length, op, flags, per-op payload rules); the region, slot and
    payload bounds are checked against the region by the server. Raises HeaderError.
    """
    size = len(frame)
    if size < HEADER_BYTES:
        raise HeaderError(
            Status.BAD_HEADER, f"truncated header: {size} bytes, need {HEADER_BYTES}", peek_request_id(frame)
        )
    rid, op, length, mflag, reserved = HEADER.unpack_from(frame)
    flags = mflag & 0xFF
    if mflag >> 8:
        raise HeaderError(Status.BAD_HEADER, "a request's status byte (flags >> 8) must be 0", rid)
    if flags & ~FLAG_BITS:
        raise HeaderError(Status.BAD_HEADER, f"unknown flag bits {flags & ~FLAG_BITS:#04x}", rid)
    if op not in REQUEST_OPS:
        what = "a reply op" if op in REPLY_OPS else "unknown op"
        raise HeaderError(Status.BAD_OP, f"{what} {op:#06x}; requests are 0x0001..0x0005", rid)
    inline = flags & Flag.INLINE
    if reserved and op in (Op.REGISTER, Op.PING):
        raise HeaderError(Status.BAD_HEADER, f"{Op(op).name} must have reserved = 0", rid)
    if op == Op.REGISTER:
        if not inline:
            raise HeaderError(Status.BAD_HEADER, "REGISTER carries its payload inline (flag INLINE)", rid)
        if length > MAX_INLINE_BYTES:
            raise HeaderError(
                Status.BAD_LENGTH, f"inline payload of {length} bytes exceeds {MAX_INLINE_BYTES}", rid
            )
        if size != HEADER_BYTES + length:
            raise HeaderError(
                Status.BAD_LENGTH, f"frame has {size - HEADER_BYTES} payload bytes, header says {length}", rid
            )
        return Header(rid, op, length, mflag, reserved)
    if inline:
        raise HeaderError(Status.BAD_HEADER, "only REGISTER may carry an inline payload", rid)
    if size != HEADER_BYTES:
        raise HeaderError(Status.BAD_HEADER, f"frame of {size} bytes; a doorbell is {HEADER_BYTES}", rid)
    if op == Op.INFER:
        if not flags & Flag.META:
            raise HeaderError(Status.BAD_META, "INFER needs flag META (metadata block at payload 0)", rid)
    elif length or flags:
        raise HeaderError(Status.BAD_LENGTH, f"{Op(op).name} carries no payload and no flags", rid)
    return Header(rid, op, length, mflag, reserved)


def decode_reply(frame: bytes) -> tuple[Header, bytes]:
    """Parse a reply frame (client side): the header and any inline payload. Raises HeaderError."""
    if len(frame) < HEADER_BYTES:
        raise HeaderError(Status.BAD_HEADER, f"truncated reply: {len(frame)} bytes", peek_request_id(frame))
    head = Header._make(HEADER.unpack_from(frame))
    if head.op not in REPLY_OPS:
        raise HeaderError(Status.BAD_OP, f"unknown reply op {head.op:#06x}", head.request_id)
    inline = bytes(frame[HEADER_BYTES:])
    if head.flags & Flag.INLINE:
        if len(inline) != head.payload_length:
            raise HeaderError(Status.BAD_LENGTH, "inline reply payload length mismatch", head.request_id)
    elif inline:
        raise HeaderError(Status.BAD_HEADER, "reply frame longer than a header", head.request_id)
    return head, inline
