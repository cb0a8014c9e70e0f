"""The verifier: each constraint of the schema is refused with a message that states it, before any
field is used; a refused request's id is still found when it verifies; crafted sharing cannot make
a small buffer decode into many objects."""

from __future__ import annotations

import struct

import pytest

from anvil_core import codec
from anvil_core.codec import pb, writer
from anvil_core.codec.schema import table


def _req(**kw: object) -> bytes:
    base: dict[str, object] = dict(
        requestId="rid",
        traceId="tid",
        model="mlp",
        priority=2,
        deadlineUnixNs=1,
        inputs=[pb.TensorT(name="x", dtype=9, shape=[1], frame=0)],
    )
    return codec.pack(pb.InferRequestT(**{**base, **kw}))[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"priority": 7}, r"InferRequest.priority is 7; it must be in 1..3"),
        ({"priority": 0}, r"InferRequest.priority is 0"),
        ({"deadlineUnixNs": -5}, r"InferRequest.deadline_unix_ns is -5; it must be in 0.."),
        ({"requestId": ""}, r"InferRequest.request_id is empty"),
        ({"requestId": None}, r"InferRequest.request_id is absent"),
        ({"requestId": b"\xff\xfe"}, r"InferRequest.request_id is not valid UTF-8"),
        ({"requestId": "r" * 257}, r"InferRequest.request_id is 257 bytes; at most 256"),
        ({"model": ""}, r"InferRequest.model is empty"),
        ({"inputs": [pb.TensorT(name="x", dtype=0)]}, r"Tensor.dtype is 0; it must be one of BOOL=1"),
        ({"inputs": [pb.TensorT(name="x", dtype=77)]}, r"Tensor.dtype is 77"),
        ({"inputs": [pb.TensorT(name="")]}, r"Tensor.name is empty"),
        ({"inputs": [pb.TensorT(name="x", dtype=9, frame=-2)]}, r"Tensor.frame is -2"),
        ({"outputs": [b"\xc3"]}, r"InferRequest.outputs is not valid UTF-8"),
    ],
)
def test_each_constraint_is_refused_with_its_statement(fields: dict[str, object], match: str) -> None:
    with pytest.raises(codec.ProtocolError, match=match) as err:
        codec.read_request(_req(**fields))
    assert err.value.reason == "invalid"


def test_register_bounds_and_union_types_are_checked() -> None:
    with pytest.raises(codec.ProtocolError, match=r"Register.credits is 65; it must be in ..64"):
        codec.read(codec.pack(pb.RegisterT(serviceId="e", credits=65))[0])
    with pytest.raises(codec.ProtocolError, match=r"ModelSpec.max_batch is 5000"):
        codec.read(
            codec.pack(pb.RegisterT(serviceId="e", models=[pb.ModelSpecT(name="m", maxBatch=5000)]))[0]
        )
    env = bytearray(codec.pack(pb.HeartbeatT(serviceId="e"))[0])
    flat = pb.Envelope.GetRootAs(bytes(env), 0)
    env[flat._tab.Pos + flat._tab.Offset(6)] = 99  # body_type
    with pytest.raises(codec.ProtocolError, match=r"Envelope.body_type is 99"):
        codec.read(bytes(env))


def _string_pos(env: bytes, text: bytes) -> int:
    return env.index(struct.pack("<I", len(text)) + text)


def test_lengths_offsets_and_terminators_outside_the_buffer_are_refused() -> None:
    env = _req(requestId="abc")
    at = _string_pos(env, b"abc")
    for bad_len, match in ((10_000, "overruns the buffer"), (2, "lacks its NUL")):
        crafted = bytearray(env)
        crafted[at : at + 4] = struct.pack("<I", bad_len)
        with pytest.raises(codec.ProtocolError, match=match) as err:
            codec.read_request(bytes(crafted))
        assert err.value.reason == "undecodable"
    for cut in range(len(env)):  # every truncation: refused, nothing else raised
        with pytest.raises(codec.ProtocolError):
            codec.read_request(env[:cut])
    with pytest.raises(codec.ProtocolError, match=r"outside"):
        codec.read_request(struct.pack("<I", 1 << 30) + env[4:])


def test_a_refused_request_still_gives_its_ids_when_they_verify() -> None:
    assert codec.peek_request_ids(_req(priority=7)) == ("rid", "tid")
    assert codec.peek_request_ids(_req(deadlineUnixNs=-1, traceId=None)) == ("rid", "")
    assert codec.peek_request_ids(_req(requestId=b"\xff")) is None
    assert codec.peek_request_ids(b"\x00" * 3) is None
    assert codec.peek_request_ids(codec.pack(pb.HeartbeatT(serviceId="e"))[0]) is None


def test_shared_objects_cannot_amplify_a_small_buffer() -> None:
    """Offsets may legally share a target; pointed at one big shape vector, 500 input slots would
    decode into 500 copies of it (1 M ints from ~40 KB): refused as over the object budget."""
    n, m = 500, 2000
    inputs = [pb.TensorT(name=f"x{i}", dtype=9, shape=list(range(m)) if i == 0 else [1]) for i in range(n)]
    body = pb.InferRequestT(requestId="r", model="m", inputs=inputs)
    env = writer.encode(pb.EnvelopeT(version=1, bodyType=pb.Body.InferRequest, body=body), table("Envelope"))
    assert len(codec.read_request(env).inputs) == n  # as written: fine
    flat = pb.Envelope.GetRootAs(env, 0)
    req = pb.InferRequest()
    req.Init(flat.Body().Bytes, flat.Body().Pos)
    first = req._tab.Vector(req._tab.Offset(18))  # position of inputs[0]'s offset
    target = first + struct.unpack_from("<I", env, first)[0]
    crafted = bytearray(env)
    for i in range(1, n):
        el = first + 4 * i
        struct.pack_into("<I", crafted, el, target - el)  # every input is tensor 0
    with pytest.raises(codec.ProtocolError, match=r"more objects than the buffer has bytes") as err:
        codec.read_request(bytes(crafted))
    assert err.value.reason == "too_large"


def test_an_absent_field_whose_default_breaks_a_constraint_is_refused() -> None:
    """flatc's Builder leaves out fields that hold their default: dtype 0 (INVALID) then is absent."""
    import flatbuffers

    body = pb.InferRequestT(requestId="r", model="m", inputs=[pb.TensorT(name="x", shape=[1])])
    env = pb.EnvelopeT(version=codec.PROTOCOL_VERSION, bodyType=pb.Body.InferRequest, body=body)
    b = flatbuffers.Builder(128)
    b.Finish(env.Pack(b))
    with pytest.raises(
        codec.ProtocolError, match=r"Tensor.dtype is absent, and its default 0 is not allowed"
    ):
        codec.read_request(bytes(b.Output()))


def _resp(**kw: object) -> bytes:
    return codec.pack(pb.InferResponseT(requestId="rid", **kw))[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"batchSize": (1 << 20) + 1}, r"InferResponse.batch_size is 1048577; it must be in ..1048576"),
        ({"batchIndex": 1 << 16}, r"InferResponse.batch_index is 65536; it must be in ..65535"),
        ({"traceId": "t" * 257}, r"InferResponse.trace_id is 257 bytes"),
    ],
)
def test_a_responses_batch_statistics_are_bounded(fields: dict[str, object], match: str) -> None:
    with pytest.raises(codec.ProtocolError, match=match):
        codec.read_response(_resp(**fields))


def test_batch_timing_round_trips_and_is_clamped_to_its_bounds() -> None:
    timing = codec.BatchTiming(size=5, input_us=7, infer_us=11, output_us=-3, exec_queue_us=2**40)
    resp = codec.read_response(
        codec.build_response(request_id="r", trace_id="", model="m", batch=timing, batch_index=2)
    )
    assert (resp.batchSize, resp.batchIndex) == (5, 2)
    assert (resp.computeInputUs, resp.computeInferUs, resp.computeOutputUs) == (7, 11, 0)
    assert resp.execQueueUs == 2**32 - 1
    assert (resp.dispatchedUnixNs, resp.executorInUnixNs, resp.executorDoneUnixNs) == (0, 0, 0)  # unstamped
    now = 1_764_700_000_123_456_789  # per-hop stamps: 64-bit ns, exact; a negative one is sent as 0
    stamped = codec.BatchTiming(size=1, input_us=0, infer_us=0, output_us=0, dispatched_unix_ns=now,
                                executor_in_unix_ns=now + 1, done_unix_ns=-5)  # fmt: skip
    resp = codec.read_response(codec.build_response(request_id="r", trace_id="", model="m", batch=stamped))
    assert (resp.dispatchedUnixNs, resp.executorInUnixNs, resp.executorDoneUnixNs) == (now, now + 1, 0)
    big = codec.BatchTiming(size=1 << 30, input_us=0, infer_us=0, output_us=0)
    resp = codec.read_response(
        codec.build_response(request_id="r", trace_id="", model="m", batch=big, batch_index=1 << 20)
    )
    assert (resp.batchSize, resp.batchIndex) == (1 << 20, (1 << 16) - 1)


def test_traceparent_travels_in_requests_and_batches_and_is_bounded() -> None:
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    req = codec.read_request(_req(traceparent=tp))
    assert req.traceparent == tp
    with pytest.raises(codec.ProtocolError, match=r"InferRequest.traceparent is 257 bytes"):
        codec.read_request(_req(traceparent="x" * 257))
    body, _ = codec.unpack(codec.pack(pb.BatchT(batchId="1", model="m", frameCounts=[], traceparent=tp)))
    assert isinstance(body, pb.BatchT) and body.traceparent == tp
