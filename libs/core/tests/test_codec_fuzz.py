"""Fuzzing the wire codec: random, mutated-valid and truncated envelopes give a verified message or
a ProtocolError, never another exception, and each read is quick and bounded; what the writer
writes from random valid messages reads back equal."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.zerocopy import meta as zm

SLOWEST_READ_CPU_S = 0.05  # a read of <= 4 KiB; a loop on a crafted count would take orders longer

_text = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 256)
_tensor = st.builds(
    pb.TensorT,
    name=_text,
    dtype=st.sampled_from(sorted(codec.DTYPE_NAMES)),
    shape=st.lists(st.integers(0, 1 << 40), max_size=8),
    frame=st.integers(-1, 64),
)
_request = st.builds(
    pb.InferRequestT,
    requestId=_text,
    traceId=_text,
    model=_text,
    modelVersion=_text,
    priority=st.integers(1, 3),
    deadlineUnixNs=st.integers(0, 2**63 - 1),
    tenant=_text,
    inputs=st.lists(_tensor, max_size=6),
    outputs=st.lists(_text, max_size=4),
)
_response = st.builds(
    pb.InferResponseT,
    requestId=_text,
    traceId=_text,
    model=_text,
    outputs=st.lists(_tensor, max_size=4),
    queueUs=st.integers(0, 2**32 - 1),
    computeUs=st.integers(0, 2**32 - 1),
    error=st.none() | st.builds(pb.ErrorT, code=st.integers(0, 8), reason=_text),
)
_bodies = st.one_of(
    _request,
    _response,
    st.builds(pb.BatchT, batchId=_text, model=_text, frameCounts=st.lists(st.integers(1, 99), max_size=9)),
    st.builds(pb.HeartbeatT, serviceId=_text, seq=st.integers(0, 2**64 - 1), inflight=st.integers(0, 99)),
    st.builds(
        pb.RegisterT,
        serviceId=_text,
        maxBatch=st.integers(0, 4096),
        credits=st.integers(0, 64),
        models=st.lists(st.builds(pb.ModelSpecT, name=_text, maxBatch=st.integers(0, 4096)), max_size=3),
    ),
)


def _fields(obj: Any) -> Any:
    if isinstance(obj, list | tuple):
        return [_fields(x) for x in obj]
    if hasattr(obj, "__dict__"):
        return {k: _fields(v) for k, v in vars(obj).items()}
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies)
def test_random_valid_messages_read_back_equal(body: Any) -> None:
    got, _ = codec.unpack(codec.pack(body))
    assert _fields(got) == _fields(body)


def read_checked(data: bytes) -> None:
    """A read returns or raises ProtocolError, within the CPU bound (re-timed once if slow, so a
    garbage collection landing in one call is not a failure)."""
    for _ in range(2):
        t0 = time.thread_time()
        try:
            codec.read(data)
        except codec.ProtocolError as exc:
            assert exc.reason in codec.REASONS and str(exc)
        took = time.thread_time() - t0
        if took < SLOWEST_READ_CPU_S:
            return
    raise AssertionError(f"a read of {len(data)} bytes used {took * 1e3:.1f} ms CPU")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_are_refused_or_read(data: bytes) -> None:
    read_checked(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies, st.integers(0, 4096), st.integers(0, 255), st.integers(0, 4096))
def test_single_byte_edits_and_truncations_are_refused_or_read(
    body: Any, pos: int, value: int, cut: int
) -> None:
    env = bytearray(codec.pack(body)[0])
    read_checked(bytes(env[: cut % (len(env) + 1)]))
    env[pos % len(env)] = value
    read_checked(bytes(env))


def test_mutations_of_every_message_kind(fuzz: Any) -> None:
    """The seeded mutation loop (bench/fuzz_long.py runs it for 100,000 inputs)."""
    x = pb.TensorT(name="INPUT0", dtype=9, shape=[2, 16], frame=0)
    shm = pb.TensorT(
        name="S", dtype=11, shape=[1], frame=-1, shm=pb.ShmRefT(region="zc-1", offset=64, length=9)
    )
    seeds = [
        codec.pack(
            pb.InferRequestT(requestId="r" * 32, traceId="t", model="mlp", inputs=[x, shm], outputs=["o"])
        )[0],
        codec.build_response(request_id="r", trace_id="t", model="m", error=(4, "late"), queue_us=1),
        codec.pack(pb.BatchT(batchId="12", model="mlp", frameCounts=[2, 1], queueUs=[5, 6]))[0],
        codec.pack(pb.RegisterT(serviceId="ex", models=[pb.ModelSpecT(name="mlp", maxBatch=8)]))[0],
    ]
    blocks = [zm.encode_infer(zm.InferMeta("mlp", (zm.TensorDesc("A", "FP32", (4,), 128, 16),)))]
    n = fuzz.cases(3000)
    t0 = time.monotonic()
    for i in range(n):
        data = fuzz.mutate(seeds[i % len(seeds)], seeds)
        read_checked(data)
        if i % 8 == 0:  # the size-prefixed ZeroCopy blocks, through the same reader
            try:
                zm.decode_infer(fuzz.mutate(blocks[0], blocks))
            except zm.MetaError:
                pass
    fuzz.record("codec", n, crashes=0, hangs=0, seconds=round(time.monotonic() - t0, 1))
