"""Wire codecs: round trips, version checks, malformed input."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_core import wire
from anvil_core.tensors import HostTensor, TensorError
from anvil_core.wire import pb


def _request(frames: list[object]) -> pb.InferRequestT:
    req = pb.InferRequestT()
    req.requestId = "r-1"
    req.traceId = "t-1"
    req.model = "mlp"
    req.priority = 1
    req.deadlineUnixNs = 123_456_789
    rng = np.random.default_rng(0)
    req.inputs = [
        wire.encode_tensor(HostTensor.from_array("a", "FP32", rng.standard_normal((3, 5))), frames),
        wire.encode_tensor(HostTensor.from_array("b", "INT64", np.arange(7)), frames),
        wire.encode_tensor(
            HostTensor.from_array("c", "BYTES", np.array([b"x", b"", b"hello"], dtype=object)), frames
        ),
    ]
    return req


def test_request_round_trip_keeps_every_field_and_tensor() -> None:
    frames: list[object] = []
    req = _request(frames)
    body, got_frames = wire.unpack(wire.pack(req, frames))
    assert isinstance(body, pb.InferRequestT)
    assert wire.text(body.requestId) == "r-1" and wire.text(body.model) == "mlp"
    assert body.priority == 1 and body.deadlineUnixNs == 123_456_789
    tensors = [wire.decode_tensor(t, got_frames) for t in body.inputs]
    assert [t.name for t in tensors] == ["a", "b", "c"]
    np.testing.assert_array_equal(tensors[0].data, req_inputs_a())
    np.testing.assert_array_equal(tensors[1].data, np.arange(7))
    assert list(tensors[2].data) == [b"x", b"", b"hello"]


def req_inputs_a() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)


def test_fixed_size_tensor_frames_are_views_not_copies() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames: list[object] = []
    wire.encode_tensor(HostTensor.from_array("x", "FP32", arr), frames)
    view = frames[0]
    assert isinstance(view, memoryview)
    arr[0, 0] = 42.0
    assert np.frombuffer(view, dtype=np.float32)[0] == 42.0


def test_other_protocol_version_is_rejected() -> None:
    parts = wire.pack(wire.error(pb.ErrorCode.INTERNAL, "x"))
    raw = bytearray(parts[0])
    original = wire.PROTOCOL_VERSION
    try:
        wire.PROTOCOL_VERSION = original + 1  # the receiver speaks a newer protocol
        with pytest.raises(wire.ProtocolError, match="protocol version"):
            wire.unpack([bytes(raw)])
    finally:
        wire.PROTOCOL_VERSION = original


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\xff" * 7, b"\x08\x00\x00\x00" + b"\xff" * 40])
def test_garbage_envelope_raises_protocol_error(garbage: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.unpack([garbage])


def test_empty_message_raises_protocol_error() -> None:
    with pytest.raises(wire.ProtocolError, match="empty"):
        wire.unpack([])


def test_tensor_byte_count_must_match_shape() -> None:
    frames: list[object] = [b"\x00" * 10]
    t = pb.TensorT()
    t.name = "x"
    t.dtype = pb.DType.FP32
    t.shape = [2, 2]
    t.frame = 0
    with pytest.raises(TensorError, match="needs 16"):
        wire.decode_tensor(t, frames)


def test_tensor_frame_index_is_bounds_checked() -> None:
    t = pb.TensorT()
    t.name = "x"
    t.dtype = pb.DType.FP32
    t.shape = [1]
    t.frame = 3
    with pytest.raises(TensorError, match="frame index 3"):
        wire.decode_tensor(t, [b"\x00" * 4])


def test_every_body_type_round_trips() -> None:
    reg = pb.RegisterT()
    reg.serviceId = "ex-1"
    reg.models = [pb.ModelSpecT()]
    reg.models[0].name = "mlp"
    for body in (
        reg,
        pb.HeartbeatT(),
        pb.BatchT(),
        pb.BatchResultT(),
        pb.InferResponseT(),
        wire.error(1, "r"),
    ):
        got, _ = wire.unpack(wire.pack(body))
        assert type(got) is type(body)


def test_pack_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        wire.pack(object())  # type: ignore[arg-type]
