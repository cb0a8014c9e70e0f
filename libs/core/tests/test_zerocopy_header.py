"""The 16-byte ZeroCopy header: layout, every refusal, and 10,000 random headers (hypothesis)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anvil_core.zerocopy import header as zh
from anvil_core.zerocopy.header import Flag, HeaderError, Op, Status


def test_layout_is_the_documented_struct() -> None:
    raw = zh.encode(0x01020304, Op.INFER, 0x0A0B0C0D, Flag.META, 0, zh.pack_reserved(7, 9))
    assert len(raw) == zh.HEADER_BYTES == 16
    assert raw == struct.pack("<IHIHI", 0x01020304, 0x0003, 0x0A0B0C0D, 0x0001, 7 << 16 | 9)
    head = zh.decode_request(raw)
    assert (head.request_id, head.op, head.payload_length) == (0x01020304, Op.INFER, 0x0A0B0C0D)
    assert (head.flags, head.status, head.region, head.slot) == (Flag.META, 0, 7, 9)


def test_replies_are_request_ops_with_the_reply_bit() -> None:
    for op in (Op.REGISTER, Op.UNREGISTER, Op.INFER, Op.PING, Op.CANCEL):
        assert Op(op | zh.REPLY_BIT) in zh.REPLY_OPS
    head, inline = zh.decode_reply(zh.encode(5, Op.ERROR, 3, Flag.INLINE, Status.BAD_SLOT) + b"abc")
    assert (head.op, head.status, inline) == (Op.ERROR, Status.BAD_SLOT, b"abc")


def test_register_carries_its_payload_inline() -> None:
    payload = b"\x00" * 8 + b"anvil-x"
    head = zh.decode_request(zh.encode(1, Op.REGISTER, len(payload), Flag.INLINE) + payload)
    assert head.payload_length == len(payload)


@pytest.mark.parametrize(
    ("frame", "status", "says"),
    [
        (b"", Status.BAD_HEADER, "truncated header: 0 bytes"),
        (b"\x07\x00\x00\x00\x03", Status.BAD_HEADER, "truncated"),
        (zh.HEADER.pack(1, 0x0042, 0, 0, 0), Status.BAD_OP, "unknown op 0x0042"),
        (zh.HEADER.pack(1, Op.INFER_OK, 0, 0, 0), Status.BAD_OP, "a reply op"),
        (zh.HEADER.pack(1, Op.INFER, 10, Flag.META | 0x80, 0), Status.BAD_HEADER, "unknown flag bits 0x80"),
        (zh.HEADER.pack(1, Op.INFER, 10, 0x0101, 0), Status.BAD_HEADER, "status byte"),
        (zh.HEADER.pack(1, Op.INFER, 10, 0, 0), Status.BAD_META, "needs flag META"),
        (zh.HEADER.pack(1, Op.INFER, 10, Flag.META, 0) + b"x", Status.BAD_HEADER, "frame of 17 bytes"),
        (zh.HEADER.pack(1, Op.PING, 4, 0, 0), Status.BAD_LENGTH, "PING carries no payload"),
        (zh.HEADER.pack(1, Op.PING, 0, 0, 5), Status.BAD_HEADER, "reserved = 0"),
        (zh.HEADER.pack(1, Op.REGISTER, 0, 0, 0), Status.BAD_HEADER, "inline"),
        (zh.HEADER.pack(1, Op.REGISTER, 4, Flag.INLINE, 0) + b"ab", Status.BAD_LENGTH, "header says 4"),
        (zh.HEADER.pack(1, Op.REGISTER, 5000, Flag.INLINE, 0), Status.BAD_LENGTH, "exceeds 1024"),
        (zh.HEADER.pack(1, Op.CANCEL, 0, Flag.INLINE, 3), Status.BAD_HEADER, "only REGISTER"),
    ],
)
def test_bad_headers_are_refused_with_a_status(frame: bytes, status: Status, says: str) -> None:
    with pytest.raises(HeaderError) as info:
        zh.decode_request(frame)
    assert info.value.status == status
    assert says in info.value.message


def test_the_request_id_of_a_short_frame_is_kept_for_the_error_reply() -> None:
    with pytest.raises(HeaderError) as info:
        zh.decode_request(b"\x2a\x00\x00\x00\x03\x00")
    assert info.value.request_id == 42


def test_encode_refuses_fields_that_do_not_fit() -> None:
    for kwargs in ({"payload_length": 1 << 32}, {"flags": 0x100}, {"status": 256}, {"reserved": -1}):
        with pytest.raises(HeaderError):
            zh.encode(1, Op.PING, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(HeaderError):
        zh.pack_reserved(1 << 16, 0)


_ANY_OP = st.one_of(st.sampled_from([int(op) for op in Op]), st.integers(0, 0xFFFF))
_HEADERS = st.one_of(
    st.binary(max_size=64),  # anything at all, truncated and oversized included
    st.builds(
        lambda rid, op, length, flag, reserved, tail: zh.HEADER.pack(rid, op, length, flag, reserved) + tail,
        st.integers(0, 0xFFFF_FFFF),
        _ANY_OP,
        st.one_of(st.integers(0, 0xFFFF_FFFF), st.integers(0, 64)),
        st.one_of(st.integers(0, 0xFFFF), st.sampled_from([0, 1, 2, 3])),
        st.integers(0, 0xFFFF_FFFF),
        st.one_of(st.just(b""), st.binary(max_size=40)),
    ),
)


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_HEADERS)
def test_random_headers_parse_or_raise_header_error_only(frame: bytes) -> None:
    """Whatever the bytes: a Header whose fields satisfy every rule, or a HeaderError with a status
    the reply can carry. Never another exception."""
    try:
        head = zh.decode_request(frame)
    except HeaderError as exc:
        assert isinstance(exc.status, Status) and exc.status != Status.OK
        assert 0 <= exc.request_id <= 0xFFFF_FFFF
        assert exc.message
        # the error reply itself always encodes
        body = exc.message.encode()[: zh.MAX_INLINE_BYTES]
        assert zh.decode_reply(zh.encode(exc.request_id, Op.ERROR, len(body), Flag.INLINE, exc.status) + body)
        return
    assert head.op in zh.REQUEST_OPS
    assert head.status == 0 and not head.flags & ~zh.FLAG_BITS
    if head.op == Op.REGISTER:
        assert len(frame) == zh.HEADER_BYTES + head.payload_length <= zh.HEADER_BYTES + zh.MAX_INLINE_BYTES
    else:
        assert len(frame) == zh.HEADER_BYTES
    assert (
        zh.encode(head.request_id, head.op, head.payload_length, head.flags, 0, head.reserved) == frame[:16]
    )
