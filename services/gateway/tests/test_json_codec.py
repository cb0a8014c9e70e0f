"""json_codec gives the stdlib json module's results: the same values in, the same numbers out."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from anvil_gateway import json_codec

BODIES = [
    b'{"x":[1.5,-0.0,1e-05,0.0012345678901234567,123456789012345678.0]}',
    b'{"x":[NaN,Infinity,-Infinity,1e400]}',  # orjson refuses these; the stdlib reads them
    b'{"x":[18446744073709551615,18446744073709551616,-9223372036854775809]}',  # past 64 bits
    b'{"x": [ -123456789012345678901234567890 ]}',
    b"\xef\xbb\xbf{}",  # a UTF-8 BOM
    '{"x":"\u00e9"}'.encode("utf-16"),
    b'{"x":"\\ud800"}',  # a lone surrogate
    b'{"x":"12345678901234567890123"}',
]
BAD = [b"", b"{bad", b"[1,]", b'{"x":01}', b"[" * 2000 + b"]" * 2000, b'{"x":"\xff"}']


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("body", BODIES)
def test_loads_gives_what_the_stdlib_gives(body: bytes) -> None:
    assert _same(json_codec.loads(body), json.loads(body))


def test_loads_leaves_deep_bodies_to_the_stdlib() -> None:
    body = b"[" * 600 + b"]" * 600  # past SAFE_DEPTH openers: the stdlib's own depth limit applies
    assert json_codec.loads(body) == json.loads(body)


@pytest.mark.parametrize("body", BAD)
def test_loads_raises_what_the_stdlib_raises(body: bytes) -> None:
    with pytest.raises(Exception) as ours:
        json_codec.loads(body)
    with pytest.raises(Exception) as stdlib:
        json.loads(body)
    assert type(ours.value) is type(stdlib.value) and str(ours.value) == str(stdlib.value)


def test_loads_reads_random_floats_as_the_stdlib_does() -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(dtype)
        body = json.dumps({"data": x.tolist()}).encode()
        assert json_codec.loads(body) == json.loads(body)


def test_dumps_writes_the_numbers_tolist_writes() -> None:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    for x in (bits.view(np.float32), rng.standard_normal(64).astype(np.float16), bits.view(np.int32)):
        doc = {"name": "y", "data": x}
        ours = json.loads(json_codec.dumps(doc))
        assert _same(ours, json.loads(json.dumps({"name": "y", "data": x.tolist()})))


def test_dumps_keeps_nan_and_infinity_as_the_stdlib_spells_them() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.1], np.float32)
    assert json_codec.dumps({"data": x}) == b'{"data":[NaN,Infinity,-Infinity,0.10000000149011612]}'


def test_dumps_falls_back_to_the_stdlib_for_what_orjson_refuses() -> None:
    doc = {"id": "\ud800", "data": np.array([1, 2], ">i4")}  # a lone surrogate, big-endian ints
    assert json_codec.dumps(doc) == b'{"id":"\\ud800","data":[1,2]}'
