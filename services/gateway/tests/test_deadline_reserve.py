"""The deadline reserve (#19): what of a budget the gateway keeps back from the deadline it sends the
scheduler, learned per priority from the answers' hops outside the scheduler's plan."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from anvil_core import codec
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.tensors import HostTensor
from anvil_gateway.admission import Admission
from anvil_gateway.deadline_reserve import DeadlineReserve
from anvil_gateway.hops import Hops
from anvil_gateway.request_path import forward


def test_off_it_keeps_nothing_back() -> None:
    r = DeadlineReserve(0.0)
    for _ in range(100):
        r.observe(1, 30_000)
    assert r.reserve_s(1, 0.050) == 0.0


def test_the_reserve_is_the_quantile_of_recent_answers_per_priority() -> None:
    r = DeadlineReserve(0.9, window=100, every=1)
    for ms in range(1, 101):  # 1..100 ms
        r.observe(1, ms * 1000)
    r.observe(3, 2_000)
    assert r.reserve_s(1, 10.0) == pytest.approx(0.090)
    assert r.reserve_s(3, 10.0) == pytest.approx(0.002)
    assert r.reserve_s(2, 10.0) == 0.0  # nothing answered at priority 2 yet
    for _ in range(100):  # the window slides: old samples leave it
        r.observe(1, 5_000)
    assert r.reserve_s(1, 10.0) == pytest.approx(0.005)


def test_it_never_takes_more_than_its_share_of_the_budget() -> None:
    r = DeadlineReserve(0.5, every=1, max_fraction=0.5)
    r.observe(1, 40_000)
    assert r.reserve_s(1, 0.050) == pytest.approx(0.025)


def test_it_is_recomputed_every_few_answers_once_warm() -> None:
    r = DeadlineReserve(0.9, window=64, every=16)
    for _ in range(16):  # warming up: recomputed at each of the first 16
        r.observe(1, 1_000)
    for _ in range(15):
        r.observe(1, 9_000)
    assert r.reserve_s(1, 1.0) == pytest.approx(0.001)  # 15 answers since the last recomputation
    r.observe(1, 9_000)
    assert r.reserve_s(1, 1.0) == pytest.approx(0.009)


def test_a_quantile_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        DeadlineReserve(1.0)


def test_hops_feed_it_the_time_outside_the_plan_of_stamped_answers_only() -> None:
    r = DeadlineReserve(0.5, every=1)
    t = time.time_ns()
    timing = codec.BatchTiming(size=1, input_us=0, infer_us=0, output_us=0, exec_queue_us=50,
                               dispatched_unix_ns=t + 1_200_000, executor_in_unix_ns=t + 1_300_000,
                               done_unix_ns=t + 3_350_000)  # fmt: skip
    env = codec.build_response(request_id="r", trace_id="t", model="m", queue_us=1_000, compute_us=2_000,
                               batch=timing)  # fmt: skip
    now = time.perf_counter_ns()
    hops = Hops(entered_ns=now - 400_000, sent_ns=now, answered_ns=now, sent_wall_ns=t,
                answered_wall_ns=t + 3_650_000)  # fmt: skip
    unstamped = codec.build_response(request_id="u", trace_id="t", model="m", queue_us=1, compute_us=1)
    Hops(entered_ns=0, sent_ns=1, answered_ns=2).record(codec.read_response(unstamped), 1, r)  # no sample
    assert r.reserve_s(1, 1.0) == 0.0
    hops.record(codec.read_response(env), 1, r)
    # gateway_in 0.4 + to_scheduler 0.2 + back 0.3 ms + the response's building since `now`
    got_us = r.reserve_s(1, 1.0) * 1e6
    assert 900 <= got_us < 900 + (time.perf_counter_ns() - now) / 1000 + 1


def test_forward_sends_the_scheduler_the_deadline_less_the_reserve() -> None:
    spec = ModelSpec(name="m", max_batch=8, inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
                     outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),))  # fmt: skip
    sent: list[Any] = []

    class Link:
        async def infer(self, rid: str, parts: list[Any], timeout_s: float, **_: Any) -> Any:
            sent.append((codec.read_request(parts[0]), timeout_s))
            return codec.read_response(codec.build_response(request_id=rid, trace_id="", model="m")), []

    reserve = DeadlineReserve(0.5, every=1)
    reserve.observe(1, 12_000)  # 12 ms of the last answers' time lay outside the plan
    st = SimpleNamespace(admission=Admission(False, 16, {}), link=Link(), reserve=reserve)
    x = HostTensor.from_array("INPUT0", "FP32", np.zeros((1, 4), np.float32))

    async def one(priority: int) -> None:
        await forward(st, spec, [x], [], "", priority, 0.050, "")  # type: ignore[arg-type]

    t0 = time.time_ns()
    asyncio.run(one(1))
    asyncio.run(one(2))  # no sample at priority 2: the whole budget
    t1 = time.time_ns()
    (req1, wait1), (req2, wait2) = sent
    assert t0 + 38_000_000 <= req1.deadlineUnixNs <= t1 + 38_000_000  # 50 - 12 ms
    assert t0 + 50_000_000 <= req2.deadlineUnixNs <= t1 + 50_000_000
    assert wait1 == wait2 == pytest.approx(0.100)  # the gateway itself still waits the whole budget (+50 ms)
