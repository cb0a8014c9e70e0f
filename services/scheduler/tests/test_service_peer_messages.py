"""Issue #18: no message a peer sends can stop the scheduler's loop. Crafted gateway and executor
messages go through ``Scheduler.handle`` (what the poll loop calls per received message) on a real
``Scheduler`` (sockets bound, no Redis needed); after each, a good request must still be admitted and
answered. A hypothesis fuzz feeds random and mutated frames the same way."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_scheduler.core import ExecutorSpec
from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings

GATEWAY = b"gw-1"
EXECUTOR = b"ex-1"


class Frame:
    """What recv_multipart(copy=False) gives: an object with .bytes and .buffer."""

    def __init__(self, data: bytes) -> None:
        self.bytes = data
        self.buffer = memoryview(data)


def request(
    rid: str | bytes = "r1", priority: int = 2, deadline_ns: int | None = None, **kw: Any
) -> list[bytes]:
    x = HostTensor.from_buffer("INPUT0", "FP32", (1, 4), struct.pack("<4f", 1, 2, 3, 4))
    env = codec.build_request(
        request_id=rid,  # type: ignore[arg-type]  # the writer takes raw bytes too, for crafting
        trace_id="t",
        model=kw.pop("model", "m"),
        version="",
        priority=priority,
        deadline_unix_ns=time.time_ns() + 10**9 if deadline_ns is None else deadline_ns,
        tenant="",
        inputs=kw.pop("inputs", [(x, 0)]),
    )
    return [env, *kw.pop("frames", [x.to_bytes_view().tobytes()])]


@pytest.fixture
def sched() -> Iterator[Any]:
    s = Scheduler(
        SchedulerSettings(gateway_port=0, executor_port=0, link_bind_host="127.0.0.1", zmq_curve=False)
    )
    s.replies: list[tuple[bytes, list[Any]]] = []  # type: ignore[misc]
    s.sent: list[list[Any]] = []  # type: ignore[misc]
    s._send_to = lambda gw, parts: s.replies.append((gw, parts))  # type: ignore[method-assign]
    s._send_executor = lambda ident, parts: s.sent.append(parts) or True  # type: ignore[method-assign]
    s.core.register_model("m", 8)
    s.core.register_executor(ExecutorSpec("ex-1", "cpu", 8, frozenset({"m"}), credits=64), time.monotonic())
    s.executors["ex-1"] = EXECUTOR
    s.last_seen["ex-1"] = time.monotonic()
    yield s
    s.gw.close()
    s.ex.close()
    s.ctx.term()
    s.bg.stop()


def from_gateway(s: Any, frames: list[bytes]) -> None:
    s.handle(s._on_gateway, [Frame(GATEWAY), *[Frame(bytes(f)) for f in frames]])
    s._poll_core(time.monotonic())


def from_executor(s: Any, frames: list[bytes]) -> None:
    s.handle(s._on_executor, [Frame(EXECUTOR), *[Frame(bytes(f)) for f in frames]])
    s._poll_core(time.monotonic())


def answer_of(s: Any, rid: str) -> Any:
    for _, parts in s.replies:
        for resp, _group in codec.unbundle(parts):
            if resp.requestId == rid:
                return resp
    return None


def assert_serves(s: Any, rid: str) -> None:
    """A good request after the crafted one is dispatched to the executor, and its result forwarded."""
    before = len(s.sent)
    from_gateway(s, request(rid))
    assert len(s.sent) == before + 1, "a good request was not dispatched"
    batch, _ = codec.unpack(s.sent[-1])
    assert isinstance(batch, pb.BatchT)
    res = pb.BatchResultT()
    res.batchId, res.executorId, res.computeUs = batch.batchId, "ex-1", 100
    resp = codec.build_response(request_id=rid, trace_id="t", model="m")
    res.frameCounts = [1]
    from_executor(s, codec.pack(res, [resp]))
    got = answer_of(s, rid)
    assert got is not None and got.error is None, "its result was not forwarded"
    assert s.core.idle_violations(time.monotonic()) == []


def good_env() -> bytes:
    return request("template")[0]


CRAFTED_FROM_GATEWAY: dict[str, list[bytes]] = {
    "priority 7": request("p7", priority=7),
    "priority 0": request("p0", priority=0),
    "truncated envelope": [good_env()[:13]],
    "empty request id": request(""),
    "non-UTF-8 request id": request(b"\xff\xfe\xfd"),
    "request id of 10 kB": request("x" * 10_000),
    "negative deadline": request("neg", deadline_ns=-5),
    "zero deadline": request("zero", deadline_ns=0),
    "garbage envelope": [b"\x00" * 3],
    "random bytes": [bytes(range(256)) * 4],
    "envelope only, tensor frame missing": request("nofr", frames=[]),
    "extra frame": request("extra", frames=[struct.pack("<4f", 1, 2, 3, 4), b"junk"]),
    "huge declared shape": request(
        "huge",
        inputs=[(HostTensor("INPUT0", "FP32", (1 << 40, 1 << 20), None), 0)],  # type: ignore[arg-type]
    ),
    "frame size does not match shape": request("short", frames=[b"\x00" * 3]),
    "unknown model": request("nomodel", model="does-not-exist"),
    "bundle whose counts do not add up": codec.bundle([request("b1"), request("b2")], responses=False)[:-1],
    "heartbeat body on the gateway port": codec.pack(pb.HeartbeatT(serviceId="gw")),
    "error body on the gateway port": codec.pack(codec.error(pb.ErrorCode.INTERNAL, "x")),
}


@pytest.mark.parametrize("name", sorted(CRAFTED_FROM_GATEWAY))
def test_a_crafted_gateway_message_is_refused_and_the_scheduler_keeps_serving(sched: Any, name: str) -> None:
    from_gateway(sched, CRAFTED_FROM_GATEWAY[name])
    assert_serves(sched, "good")


@pytest.mark.parametrize(
    ("name", "rid"),
    [
        ("priority 7", "p7"),
        ("negative deadline", "neg"),
        ("huge declared shape", "huge"),
        ("extra frame", "extra"),
    ],
)
def test_a_refused_request_with_an_id_is_answered_with_the_violated_constraint(
    sched: Any, name: str, rid: str
) -> None:
    from_gateway(sched, CRAFTED_FROM_GATEWAY[name])
    resp = answer_of(sched, rid)
    assert resp is not None and resp.error is not None
    assert resp.error.code == pb.ErrorCode.BAD_REQUEST
    assert resp.error.reason.startswith("refused: ")
    assert sched.drops.counts, "the refusal is counted"


def test_a_bad_request_inside_a_bundle_spoils_none_of_its_neighbours(sched: Any) -> None:
    from_gateway(sched, codec.bundle([request("bad", priority=9), request("ok")], responses=False))
    assert len(sched.sent) == 1 and answer_of(sched, "bad") is not None


def _register(max_batch: int = 8, credits: int = 2, name: str | bytes = "m", lanes: int = 0) -> list[bytes]:
    reg = pb.RegisterT()
    reg.lanes = lanes
    reg.kind, reg.serviceId, reg.device, reg.maxBatch, reg.credits = (
        pb.ServiceKind.EXECUTOR,
        "ex-1",
        "cpu",
        max_batch,
        credits,
    )
    spec = pb.ModelSpecT()
    spec.name, spec.maxBatch = name, max_batch
    reg.models = [spec]
    return codec.pack(reg)


def _result(batch_id: str, counts: list[int], frames: list[bytes]) -> list[bytes]:
    res = pb.BatchResultT()
    res.batchId, res.executorId, res.frameCounts = batch_id, "ex-1", counts
    return codec.pack(res, frames)


CRAFTED_FROM_EXECUTOR: dict[str, list[bytes]] = {
    "garbage": [b"\x01\x02\x03"],
    "register with max batch 2**31": _register(max_batch=2**31 - 1),
    "register with 10**6 credits": _register(credits=10**6),
    "register with a non-UTF-8 model": _register(name=b"\xff\xfe"),
    "register with 17 lanes": _register(lanes=17),
    "result for a batch id that is not a number": _result("nope", [], []),
    "result for an unknown batch": _result(
        "999999", [1], [codec.build_response(request_id="zz", trace_id="", model="m")]
    ),
    "result whose counts do not add up": _result("1", [3], [b"x"]),
    "an InferRequest on the executor port": request("wrongport"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED_FROM_EXECUTOR))
def test_a_crafted_executor_message_is_refused_and_the_scheduler_keeps_serving(sched: Any, name: str) -> None:
    from_executor(sched, CRAFTED_FROM_EXECUTOR[name])
    assert sched.executors.get("ex-1") == EXECUTOR
    assert_serves(sched, "good")


@pytest.mark.parametrize(("lanes", "want"), [(0, 1), (1, 1), (4, 4), (16, 16)])
def test_a_register_sets_the_executors_lanes(sched: Any, lanes: int, want: int) -> None:
    """0: an executor from before lanes existed runs one batch at a time."""
    from_executor(sched, _register(credits=8, lanes=lanes))
    (spec,) = [s for s in sched.core.pool.specs() if s.executor_id == "ex-1"]
    assert spec.lanes == want and spec.credits == 8


def test_a_result_from_an_unregistered_identity_is_refused_and_asked_to_register(sched: Any) -> None:
    sched.handle(sched._on_executor, [Frame(b"intruder"), *[Frame(f) for f in _result("1", [], [])]])
    assert "intruder" not in sched.last_seen
    assert sched.drops.counts.get("unregistered") == 1


_frames = st.lists(st.binary(max_size=96), min_size=0, max_size=5)


@st.composite
def mutated(draw: st.DrawFn) -> list[bytes]:
    """A valid request or bundle with some bytes flipped, cut or appended."""
    frames = [
        bytearray(f)
        for f in draw(
            st.sampled_from([request("m1"), codec.bundle([request("a"), request("b")], responses=False)])
        )
    ]
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(frames) - 1))
        if frames[i]:
            j = draw(st.integers(0, len(frames[i]) - 1))
            frames[i][j] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(frames) - 1))
        frames[i] = frames[i][: draw(st.integers(0, len(frames[i])))]
    return [bytes(f) for f in frames]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(_frames, mutated()))
def test_fuzz_gateway_port_never_raises(sched: Any, frames: list[bytes]) -> None:
    from_gateway(sched, frames)  # raises if anything escapes handle()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_frames)
def test_fuzz_executor_port_never_raises(sched: Any, frames: list[bytes]) -> None:
    from_executor(sched, frames)


def test_after_the_fuzz_it_still_serves(sched: Any) -> None:
    for frames in [[b""], [b"\x00" * 64], [good_env()[:-7]], [good_env(), b"", b""]]:
        from_gateway(sched, frames)
    assert_serves(sched, "after")


def test_scheduler_binds_real_sockets(sched: Any) -> None:
    assert sched.gw.getsockopt(zmq.LAST_ENDPOINT).startswith(b"tcp://127.0.0.1:")
