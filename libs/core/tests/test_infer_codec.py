"""Hot-path codecs: hand-built envelopes read back through the generated accessors."""

from __future__ import annotations

import numpy as np
import pytest

from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.tensors import HostTensor
from anvil_core.wire import pb


def test_request_round_trip_including_shared_memory_inputs() -> None:
    frames: list[object] = []
    x = HostTensor.from_array("x", "FP16", np.arange(6).reshape(2, 3))
    env = codec.build_request(
        request_id="rid",
        trace_id="tid",
        model="m",
        version="3",
        priority=1,
        deadline_unix_ns=2**62,
        tenant="acme",
        inputs=codec.tensor_frames([x], frames),
        shm_inputs=[("y", "INT32", (4,), codec.ShmSpan("anvil-r1", 128, 16))],
        outputs=["a", "b"],
    )
    req = codec.open_request(env)
    assert (req.RequestId(), req.TraceId(), req.Model(), req.ModelVersion()) == (b"rid", b"tid", b"m", b"3")
    assert req.Priority() == 1 and req.DeadlineUnixNs() == 2**62 and req.Tenant() == b"acme"
    assert [req.Outputs(i) for i in range(req.OutputsLength())] == [b"a", b"b"]
    got = codec.request_tensor(req.Inputs(0), frames)
    np.testing.assert_array_equal(got.data, x.data)
    shm = req.Inputs(1)
    assert shm.Frame() == -1 and shm.Shm().Region() == b"anvil-r1"
    assert (shm.Shm().Offset(), shm.Shm().Length()) == (128, 16)
    # the object API reads the same bytes
    body, _ = wire.unpack([env])
    assert isinstance(body, pb.InferRequestT) and wire.text(body.requestId) == "rid"


def test_response_round_trip_with_error() -> None:
    env = codec.build_response(
        request_id=b"r",
        trace_id="t",
        model="m",
        error=(pb.ErrorCode.DEADLINE, "late"),
        queue_us=5,
        compute_us=7,
    )
    resp = codec.open_response(env)
    assert resp.Error().Code() == pb.ErrorCode.DEADLINE and resp.Error().Reason() == b"late"
    assert (resp.QueueUs(), resp.ComputeUs(), resp.OutputsLength()) == (5, 7, 0)


def test_opening_the_wrong_body_type_is_a_protocol_error() -> None:
    env = codec.build_response(request_id="r", trace_id="t", model="m")
    with pytest.raises(wire.ProtocolError, match="expected body type"):
        codec.open_request(env)


@pytest.mark.parametrize("garbage", [b"", b"\x01", b"\xff" * 64])
def test_garbage_is_a_protocol_error(garbage: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        codec.open_request(garbage)


def test_split_groups_checks_the_counts() -> None:
    assert list(codec.split_groups([1, 2, 3], [2, 1])) == [[1, 2], [3]]
    with pytest.raises(wire.ProtocolError):
        list(codec.split_groups([1, 2, 3], [2, 2]))
    with pytest.raises(wire.ProtocolError):
        list(codec.split_groups([1], [0, 1]))


def _groups() -> list[list[bytes]]:
    return [[codec.build_response(request_id=f"r{i}", trace_id="t", model="m"), *[b"p" * j for j in range(i)]]
            for i in range(4)]  # fmt: skip


@pytest.mark.parametrize("responses", [False, True])
def test_bundle_round_trips_its_groups(responses: bool) -> None:
    groups = _groups()
    msg = codec.bundle(groups, responses=responses)
    assert len(msg) == 1 + sum(map(len, groups))  # one head frame, then the groups' frames unchanged
    assert pb.Envelope.GetRootAs(msg[0], 0).BodyType() == (
        pb.Body.BatchResult if responses else pb.Body.Batch
    )
    assert [[bytes(f) for f in g] for g in codec.unbundle(msg)] == groups


def test_a_lone_group_travels_as_itself() -> None:
    group = _groups()[2]
    assert codec.bundle([group], responses=True) == group
    assert codec.unbundle(group) == [group]


def test_unbundle_refuses_what_does_not_add_up() -> None:
    msg = codec.bundle(_groups(), responses=False)
    with pytest.raises(wire.ProtocolError, match="do not add up"):
        codec.unbundle(msg[:-1])  # a frame short
    with pytest.raises(wire.ProtocolError):
        codec.unbundle([b"\xff" * 3, b"x"])  # no envelope at all
    with pytest.raises(wire.ProtocolError, match="empty"):
        codec.unbundle([])
