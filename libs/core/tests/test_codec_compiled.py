"""The codec's compiled paths (writer._compile, reader._compile: straight-line Python per table type
and layout) against the generic field-by-field ones they replace: the same bytes written, the same
objects read, the same ProtocolError (message and reason) for the same bad buffer, including crafted
vtables (overlapping fields, absent required fields, fields past the table) and a peer that sends
more layouts than are compiled."""

from __future__ import annotations

import random
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from anvil_core import codec
from anvil_core.codec import pb, reader, writer
from anvil_core.codec.schema import table

sys.path.insert(0, str(Path(__file__).parent))
from test_codec_fuzz import _bodies, _fields  # the fuzz tests' random valid messages


@contextmanager
def generic(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Both sides of the codec on their generic paths only."""
    with monkeypatch.context() as m:
        m.setattr(writer, "_table", writer._table_generic)
        m.setattr(reader, "READERS_PER_TABLE", 0)
        m.setattr(reader, "_READERS", {})
        yield


def _read(data: bytes) -> tuple[str, Any]:
    try:
        return "ok", _fields(codec.read(data))
    except codec.ProtocolError as exc:
        return "error", (str(exc), exc.reason)


def _both(monkeypatch: pytest.MonkeyPatch, data: bytes) -> tuple[Any, Any]:
    compiled = _read(data)
    with generic(monkeypatch):
        return compiled, _read(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_bodies)
def test_compiled_writer_writes_the_generic_writers_bytes(monkeypatch: pytest.MonkeyPatch, body: Any) -> None:
    fast = codec.pack(body)[0]
    with generic(monkeypatch):
        slow = codec.pack(body)[0]
    assert bytes(fast) == bytes(slow)
    compiled, reference = _both(monkeypatch, bytes(fast))
    assert compiled == reference and compiled[0] == "ok"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_bodies)
def test_edited_buffers_read_or_fail_alike(monkeypatch: pytest.MonkeyPatch, body: Any) -> None:
    env = bytes(codec.pack(body)[0])
    rng = random.Random(len(env))
    for _ in range(20):
        bad = bytearray(env)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        compiled, reference = _both(monkeypatch, bytes(bad))
        assert compiled == reference


def _request_with_vtable(edit: Any) -> bytes:
    """An Envelope holding an InferRequest whose vtable `edit(offsets) -> offsets` rewrote."""
    env = bytearray(codec.pack(pb.InferRequestT(requestId="r1", traceId="t", model="m", priority=2))[0])
    root = struct.unpack_from("<I", env, 0)[0]
    env_desc = table("Envelope")
    # the request table: the Envelope's union field (the body) points at it
    got = codec.read(bytes(env))
    assert isinstance(got, pb.InferRequestT)
    vt_root = root - struct.unpack_from("<i", env, root)[0]
    n_root = (struct.unpack_from("<H", env, vt_root)[0] - 4) // 2
    offs_root = struct.unpack_from(f"<{n_root}H", env, vt_root + 4)
    body_field = next(f for f in env_desc.fields if f.kind == 3)  # Kind.UNION
    at = root + offs_root[body_field.slot]
    pos = at + struct.unpack_from("<I", env, at)[0]
    vt = pos - struct.unpack_from("<i", env, pos)[0]
    n = (struct.unpack_from("<H", env, vt)[0] - 4) // 2
    offs = list(struct.unpack_from(f"<{n}H", env, vt + 4))
    struct.pack_into(f"<{n}H", env, vt + 4, *edit(offs))
    return bytes(env)


def test_crafted_vtables_fail_or_read_as_the_generic_reader_does(monkeypatch: pytest.MonkeyPatch) -> None:
    desc = table("InferRequest")
    slot = {f.attr: f.slot for f in desc.fields}

    def overlap(offs: list[int]) -> list[int]:  # the trace id read from where the request id's is
        offs[slot["traceId"]] = offs[slot["requestId"]]
        return offs

    def drop_required(offs: list[int]) -> list[int]:
        offs[slot["requestId"]] = 0
        return offs

    def past_the_table(offs: list[int]) -> list[int]:
        offs[slot["priority"]] = 60_000
        return offs

    def bad_enum_offset(offs: list[int]) -> list[int]:  # priority read from the deadline's bytes
        offs[slot["priority"]] = offs[slot["deadlineUnixNs"]]
        return offs

    for edit in (overlap, drop_required, past_the_table, bad_enum_offset):
        compiled, reference = _both(monkeypatch, _request_with_vtable(edit))
        assert compiled == reference, edit.__name__
    assert _read(_request_with_vtable(overlap))[0] == "ok"  # legal flatbuffers: both fields share bytes
    assert _read(_request_with_vtable(drop_required))[0] == "error"


def test_layouts_past_the_compiled_limit_take_the_generic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_READERS", {})
    monkeypatch.setattr(reader, "READERS_PER_TABLE", 3)
    messages = [  # five layouts of InferRequest: which of its optional references are present
        pb.InferRequestT(requestId="r", traceId="t", model="m", priority=2),
        pb.InferRequestT(requestId="r", traceId="t", model="m", priority=2, tenant="x"),
        pb.InferRequestT(requestId="r", traceId="t", model="m", priority=2, outputs=["o"]),
        pb.InferRequestT(requestId="r", traceId="t", model="m", priority=2, tenant="x", outputs=["o"]),
        pb.InferRequestT(requestId="r", traceId="t", model="m", priority=2, modelVersion="1"),
    ]
    for msg in messages:
        assert _fields(codec.read(codec.pack(msg)[0])) == _fields(msg)
    assert len(reader._READERS[id(table("InferRequest"))]) == 3
