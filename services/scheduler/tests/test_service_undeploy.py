"""The scheduler service follows undeploys (docs/deploy.md): requests queued for a model the registry
marks UNLOADED are answered NOT_FOUND (none dropped), new ones too, registrations do not bring it
back, and once it is deployed again the executors' last registrations serve it at once."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings

GATEWAY, EXECUTOR = b"gw-1", b"ex-1"


class Frame:
    def __init__(self, data: bytes) -> None:
        self.bytes = data
        self.buffer = memoryview(data)


def request(rid: str) -> list[Frame]:
    x = HostTensor.from_buffer("INPUT0", "FP32", (1, 4), struct.pack("<4f", 1, 2, 3, 4))
    env = codec.build_request(
        request_id=rid,
        trace_id="t",
        model="m",
        version="",
        priority=2,
        deadline_unix_ns=time.time_ns() + 10**10,
        tenant="",
        inputs=[(x, 0)],
    )
    return [Frame(GATEWAY), Frame(env), Frame(x.to_bytes_view().tobytes())]


def register(models: list[str], credits: int = 1) -> list[Frame]:
    reg = pb.RegisterT()
    reg.kind, reg.serviceId, reg.device, reg.maxBatch, reg.credits = (
        pb.ServiceKind.EXECUTOR, "ex-1", "cpu", 8, credits,
    )  # fmt: skip
    reg.models = []
    for name in models:
        spec = pb.ModelSpecT()
        spec.name, spec.version, spec.maxBatch = name, "1", 8
        reg.models.append(spec)
    return [Frame(EXECUTOR), *[Frame(bytes(f)) for f in codec.pack(reg)]]


def answers(s: Any) -> dict[str, tuple[int, str]]:
    out = {}
    for _, parts in s.replies:
        for resp, _group in codec.unbundle([p if isinstance(p, Frame) else Frame(bytes(p)) for p in parts]):
            err = resp.error
            out[resp.requestId] = (err.code, err.reason) if err is not None else (0, "")
    return out


@pytest.fixture
def sched() -> Iterator[Any]:
    s = Scheduler(
        SchedulerSettings(gateway_port=0, executor_port=0, link_bind_host="127.0.0.1", zmq_curve=False)
    )
    s.replies = []
    s.sent = []
    s._send_to = lambda gw, parts: s.replies.append((gw, parts))
    s._send_executor = lambda ident, parts: s.sent.append(parts) or True
    yield s
    s.gw.close()
    s.ex.close()
    s.ctx.term()
    s.bg.stop()


def test_undeploy_answers_the_queue_and_redeploy_takes_the_model_back(sched: Any) -> None:
    s = sched
    s.handle(s._on_executor, register(["m", "other"]))
    assert "m" in s.core.models()
    for i in range(5):  # one credit: one batch leaves, four wait
        s.handle(s._on_gateway, request(f"r{i}"))
        s._poll_core(time.monotonic())
    assert len(s.sent) == 1 and s.core.accounting(time.monotonic()).queued_requests == 4

    s.unloads.apply({"m"}, time.monotonic())  # what _read_unloaded posts when the record says UNLOADED
    s._remove_unloaded(time.monotonic())
    got = answers(s)
    assert sorted(got) == ["r1", "r2", "r3", "r4"]
    assert all(code == pb.ErrorCode.NOT_FOUND and "was undeployed" in why for code, why in got.values())
    assert "m" not in s.core.models() and "other" in s.core.models()

    s.handle(s._on_gateway, request("late"))  # waits for a read of the registry begun after it
    assert "late" not in answers(s) and s.unloads.parked == 1
    s.unloads.apply({"m"}, time.monotonic())  # that read: still unloaded
    s._remove_unloaded(time.monotonic())
    assert answers(s)["late"] == (pb.ErrorCode.NOT_FOUND, "model 'm' is not deployed")
    s.handle(s._on_executor, register(["m", "other"]))  # an executor that has not unloaded it yet
    assert "m" not in s.core.models()

    s.unloads.apply(set(), time.monotonic())  # deployed again: no new Register needed
    s._remove_unloaded(time.monotonic())
    assert "m" in s.core.models() and any("m" in spec.models for spec in s.core.pool.specs())


def _series_of(model: str) -> list[str]:
    """The sample lines of the scheduler's registry that carry `model` as their model label."""
    text = generate_latest().decode()
    return [line for line in text.splitlines() if f'model="{model}"' in line and not line.startswith("#")]


def test_a_batch_in_flight_at_the_undeploy_is_answered_and_brings_back_no_series(sched: Any) -> None:
    s = sched
    s.handle(s._on_executor, register(["m"]))
    s.handle(s._on_gateway, request("flying"))
    s._poll_core(time.monotonic())
    assert len(s.sent) == 1
    assert _series_of("m"), "the dispatch should have created the model's series"

    s.unloads.apply({"m"}, time.monotonic())
    s._remove_unloaded(time.monotonic())
    assert _series_of("m") == []

    batch, _ = codec.unpack(s.sent[0])
    assert isinstance(batch, pb.BatchT)
    res = pb.BatchResultT()
    res.batchId, res.executorId, res.computeUs, res.frameCounts = batch.batchId, "ex-1", 100, [1]
    resp = codec.build_response(request_id="flying", trace_id="t", model="m")
    s.handle(s._on_executor, [Frame(EXECUTOR), *[Frame(bytes(f)) for f in codec.pack(res, [resp])]])
    assert answers(s)["flying"] == (0, "")  # the client still gets its result
    assert _series_of("m") == [], "the late answer re-created the undeployed model's series"


def test_a_read_begun_before_a_load_does_not_undeploy_what_a_gateway_then_sent(sched: Any) -> None:
    """The CI race (tests/integration/test_grpc.py): a read of the registry begun while the model
    was unloaded, applied after it was loaded again and a request for it was queued, must not
    answer that request NOT_FOUND; a read begun after the request decides."""
    s = sched
    s.handle(s._on_executor, register(["m"], credits=0))  # no credit: requests stay queued
    read_began = time.monotonic()
    s.handle(s._on_gateway, request("after-load"))  # the gateway saw m deployed after the read began
    s.unloads.apply({"m"}, read_began)  # the stale read lands
    s._remove_unloaded(time.monotonic())
    assert "m" in s.core.models() and "after-load" not in answers(s)
    s.unloads.apply({"m"}, time.monotonic())  # a read begun after the request: really unloaded
    s._remove_unloaded(time.monotonic())
    assert answers(s)["after-load"] == (
        pb.ErrorCode.NOT_FOUND,
        "model 'm' was undeployed while the request waited",
    )


def test_a_request_for_a_model_held_unloaded_is_served_when_a_fresh_read_finds_it_deployed(
    sched: Any,
) -> None:
    """A load answers once executors serve the model, which can be before this scheduler reads the
    registry again: the request waits for that read instead of hearing NOT_FOUND."""
    s = sched
    s.handle(s._on_executor, register(["m"]))
    s.unloads.apply({"m"}, time.monotonic())
    s._remove_unloaded(time.monotonic())
    assert "m" not in s.core.models()
    s.handle(s._on_gateway, request("right-after-load"))
    assert "right-after-load" not in answers(s) and s.unloads.parked == 1
    s.unloads.apply(set(), time.monotonic())  # the fresh read: deployed again
    s._remove_unloaded(time.monotonic())
    s._poll_core(time.monotonic())
    assert "right-after-load" not in answers(s) and len(s.sent) == 1  # dispatched, not refused
    assert s.unloads.parked == 0
