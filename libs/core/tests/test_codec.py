"""The wire codec: round trips through both flatbuffers implementations, versions, framing."""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor, TensorError


def _request(frames: list[object], **kw: object) -> bytes:
    x = HostTensor.from_array("x", "FP16", np.arange(6).reshape(2, 3))
    s = HostTensor.from_array("s", "BYTES", np.array([b"x", b"", b"hello"], dtype=object))
    args: dict[str, object] = dict(
        request_id="rid",
        trace_id="tid",
        model="m",
        version="3",
        priority=1,
        deadline_unix_ns=2**62,
        tenant="acme",
        inputs=codec.tensor_frames([x, s], frames),
        shm_inputs=[("y", "INT32", (4,), codec.ShmSpan("anvil-r1", 128, 16))],
        outputs=["a", "b"],
    )
    return codec.build_request(**{**args, **kw})  # type: ignore[arg-type]


def test_request_round_trip_including_shared_memory_inputs() -> None:
    frames: list[object] = []
    env = _request(frames)
    req = codec.read_request(env)
    assert (req.requestId, req.traceId, req.model, req.modelVersion, req.tenant) == (
        "rid",
        "tid",
        "m",
        "3",
        "acme",
    )
    assert req.priority == 1 and req.deadlineUnixNs == 2**62 and req.outputs == ("a", "b")
    codec.check_payloads(req.inputs, frames, "input")
    x, s = (codec.request_tensor(t, frames) for t in req.inputs[:2])
    np.testing.assert_array_equal(x.data, np.arange(6).reshape(2, 3))
    assert list(s.data) == [b"x", b"", b"hello"]
    shm = req.inputs[2]
    assert shm.frame == -1 and (shm.shm.region, shm.shm.offset, shm.shm.length) == ("anvil-r1", 128, 16)


def test_flatc_generated_accessors_read_what_the_writer_wrote() -> None:
    env = _request([])
    flat = pb.Envelope.GetRootAs(env, 0)
    req = pb.InferRequest()
    req.Init(flat.Body().Bytes, flat.Body().Pos)
    assert flat.Version() == codec.PROTOCOL_VERSION and flat.BodyType() == pb.Body.InferRequest
    assert (req.RequestId(), req.Priority(), req.DeadlineUnixNs(), req.InputsLength()) == (
        b"rid",
        1,
        2**62,
        3,
    )
    assert req.Inputs(2).Shm().Offset() == 128 and req.Inputs(0).ShapeAsNumpy().tolist() == [2, 3]


def _flatc_pack(body: object) -> bytes:
    """The flatbuffers package's own Builder (back to front, defaults elided) around `body`."""
    env = pb.EnvelopeT()
    env.version = codec.PROTOCOL_VERSION
    env.bodyType = next(v for k, v in vars(pb.Body).items() if k == type(body).__name__[:-1])
    env.body = body
    b = flatbuffers.Builder(256)
    b.Finish(env.Pack(b))
    return bytes(b.Output())


def test_the_reader_reads_what_flatc_builder_wrote() -> None:
    t = pb.TensorT(name="o", dtype=pb.DType.INT64, shape=[3], frame=0)
    body = pb.InferResponseT(requestId="r", traceId="t", model="m", outputs=[t], queueUs=5, computeUs=7)
    got = codec.read_response(_flatc_pack(body))
    assert (got.requestId, got.queueUs, got.computeUs, got.error) == ("r", 5, 7, None)
    assert (got.outputs[0].name, got.outputs[0].shape, got.outputs[0].frame) == ("o", (3,), 0)
    spec = pb.ModelSpecT(name="mlp", version="1", maxBatch=8)
    reg = pb.RegisterT(kind=pb.ServiceKind.EXECUTOR, serviceId="ex-1", device="cpu", maxBatch=8, credits=2)
    reg.models = [spec]
    got_reg = codec.read(_flatc_pack(reg))
    assert (got_reg.serviceId, got_reg.credits, got_reg.models[0].name, got_reg.models[0].maxBatch) == (
        "ex-1",
        2,
        "mlp",
        8,
    )


@pytest.mark.parametrize(
    "body",
    [
        pb.RegisterT(serviceId="ex-1", models=[pb.ModelSpecT(name="mlp")]),
        pb.HeartbeatT(serviceId="ex-1", seq=9),
        pb.BatchT(batchId="7", model="m", frameCounts=[1, 2], queueUs=[3, 4]),
        pb.BatchResultT(batchId="7", error=codec.error(pb.ErrorCode.INTERNAL, "x")),
        pb.InferResponseT(requestId="r"),
        codec.error(1, "r"),
    ],
    ids=lambda b: type(b).__name__,
)
def test_every_body_type_round_trips(body: object) -> None:
    got, frames = codec.unpack(codec.pack(body, [b"p"]))
    assert type(got) is type(body) and frames == [b"p"]
    assert codec.pack(got) == codec.pack(body)  # every field read back as written


def test_other_protocol_version_is_refused() -> None:
    env = bytearray(codec.pack(codec.error(pb.ErrorCode.INTERNAL, "x"))[0])
    flat = pb.Envelope.GetRootAs(bytes(env), 0)
    pos = flat._tab.Pos + flat._tab.Offset(4)  # where the version was written
    env[pos : pos + 2] = (codec.PROTOCOL_VERSION + 1).to_bytes(2, "little")
    with pytest.raises(codec.ProtocolError, match="protocol version") as err:
        codec.unpack([bytes(env)])
    assert err.value.reason == "version"


def test_wrong_body_type_empty_and_oversized_messages_are_refused() -> None:
    with pytest.raises(codec.ProtocolError, match="expected InferRequest, got InferResponse"):
        codec.read_request(codec.build_response(request_id="r", trace_id="t", model="m"))
    with pytest.raises(codec.ProtocolError, match="empty"):
        codec.unpack([])
    with pytest.raises(codec.ProtocolError, match="at most") as err:
        codec.read(bytes(codec.MAX_ENVELOPE_BYTES + 1))
    assert err.value.reason == "too_large"


def test_pack_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        codec.pack(object())


def test_tensor_frames_are_views_and_checked_against_the_shape() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames: list[object] = []
    codec.tensor_frames([HostTensor.from_array("x", "FP32", arr)], frames)
    arr[0, 0] = 42.0
    assert np.frombuffer(frames[0], dtype=np.float32)[0] == 42.0  # type: ignore[call-overload]
    t = pb.TensorT(name="x", dtype=pb.DType.FP32, shape=(2, 2), frame=0)
    with pytest.raises(TensorError, match="needs 16"):
        codec.request_tensor(t, [b"\x00" * 10])
    t.frame = 3
    with pytest.raises(TensorError, match="frame index 3"):
        codec.request_tensor(t, [b"\x00" * 16])


@pytest.mark.parametrize(
    ("tensors", "frames", "match"),
    [
        ([pb.TensorT(name="a", dtype=9, shape=(2,), frame=0)], [b"\0" * 7], "holds 7 bytes"),
        ([pb.TensorT(name="a", dtype=9, shape=(-1,), frame=0)], [b""], "negative"),
        ([pb.TensorT(name="a", dtype=9, shape=(1,) * 9, frame=0)], [b"\0" * 4], "9 dimensions"),
        ([pb.TensorT(name="a", dtype=9, shape=(1,), frame=1)], [b"\0" * 4], "does not exist"),
        ([pb.TensorT(name="a", dtype=9, shape=(1,), frame=-1)], [], "no frame"),
        ([], [b"x"], "only 0 belong"),
        ([pb.TensorT(name=f"t{i}", dtype=9, frame=-1) for i in range(65)], [], "at most 64"),
    ],
)
def test_check_payloads_states_the_constraint(tensors: list[object], frames: list[bytes], match: str) -> None:
    with pytest.raises(codec.ProtocolError, match=match) as err:
        codec.check_payloads(tensors, frames, "input")  # type: ignore[arg-type]
    assert err.value.reason == "invalid"


def test_split_groups_checks_the_counts() -> None:
    assert list(codec.split_groups([1, 2, 3], [2, 1])) == [[1, 2], [3]]
    for counts in ([2, 2], [0, 3]):
        with pytest.raises(codec.ProtocolError):
            list(codec.split_groups([1, 2, 3], counts))


def _groups() -> list[list[bytes]]:
    return [
        [codec.build_response(request_id=f"r{i}", trace_id="t", model="m"), *[b"p" * j for j in range(i)]]
        for i in range(4)
    ]


@pytest.mark.parametrize("responses", [False, True])
def test_bundle_round_trips_its_groups_and_isolates_a_bad_one(responses: bool) -> None:
    groups = _groups()
    groups[1][0] = b"\xff" * 40  # one undecodable envelope among good ones
    msg = codec.bundle(groups, responses=responses)
    assert len(msg) == 1 + sum(map(len, groups))
    got = codec.unbundle(msg)
    assert [g for _, g in got] == groups
    assert isinstance(got[1][0], codec.ProtocolError)
    assert [b.requestId for i, (b, _) in enumerate(got) if i != 1] == ["r0", "r2", "r3"]


def test_a_lone_group_travels_as_itself_and_bad_bundles_raise() -> None:
    group = _groups()[2]
    assert codec.bundle([group], responses=True) == group
    assert [g for _, g in codec.unbundle(group)] == [group]
    msg = codec.bundle(_groups(), responses=False)
    with pytest.raises(codec.ProtocolError, match="do not add up"):
        codec.unbundle(msg[:-1])
    ((refused, group),) = codec.unbundle([b"\xff" * 3, b"x"])  # not a bundle: one refused message
    assert isinstance(refused, codec.ProtocolError) and group == [b"\xff" * 3, b"x"]
