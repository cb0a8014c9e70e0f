"""Host tensors and the BYTES encoding."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_core.tensors import HostTensor, TensorError, decode_bytes_elements, encode_bytes_elements


def test_bytes_encoding_round_trips() -> None:
    items = [b"", b"a", b"\x00\xff" * 100]
    raw = encode_bytes_elements(np.array(items, dtype=object))
    assert len(raw) == sum(4 + len(i) for i in items)
    assert decode_bytes_elements(raw, 3) == items


@pytest.mark.parametrize(
    ("raw", "count", "match"),
    [
        (b"\x05\x00\x00\x00abc", 1, "5 bytes declared"),
        (b"\x01\x00", 1, "length prefix"),
        (b"\x01\x00\x00\x00ab", 1, "trailing"),
    ],
)
def test_bytes_decoding_checks_every_length(raw: bytes, count: int, match: str) -> None:
    with pytest.raises(TensorError, match=match):
        decode_bytes_elements(raw, count)


def test_unknown_datatype_names_the_supported_ones() -> None:
    with pytest.raises(TensorError, match="supported: BOOL"):
        HostTensor.from_array("x", "FP8", np.zeros(2))


def test_negative_dimension_is_rejected() -> None:
    with pytest.raises(TensorError, match="negative"):
        HostTensor.from_buffer("x", "FP32", (-1, 2), b"")


def test_from_buffer_is_zero_copy() -> None:
    buf = bytearray(8)
    t = HostTensor.from_buffer("x", "INT32", (2,), memoryview(buf))
    buf[0] = 7
    assert t.data[0] == 7
