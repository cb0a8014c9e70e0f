"""Per-hop timing at the gateway (#19): the split of a request's time that travels back in the
x-anvil-hops-us header and feeds anvil_gateway_hop_us{hop,priority}."""

from __future__ import annotations

from prometheus_client import REGISTRY

from anvil_core import codec
from anvil_gateway.hops import TRANSIT_HOPS, Hops


def _response(queue_us: int, compute_us: int, batch: codec.BatchTiming | None = None) -> object:
    env = codec.build_response(
        request_id="r", trace_id="t", model="m", queue_us=queue_us, compute_us=compute_us, batch=batch
    )
    return codec.read_response(env)


def _stamped(sent_wall_ns: int) -> tuple[Hops, object]:
    """A request sent at `sent_wall_ns` (wall clock): admitted 0.2 ms later, queued 1 ms, dispatched,
    read by the executor 0.1 ms later, queued there 0.05 ms, computed 2 ms, its outputs copied out,
    answered at the gateway 0.3 ms after that (round trip 3.65 ms)."""
    t = sent_wall_ns
    dispatched = t + 200_000 + 1_000_000
    exec_in = dispatched + 100_000
    done = exec_in + 50_000 + 2_000_000
    answered = done + 300_000
    timing = codec.BatchTiming(size=1, input_us=0, infer_us=0, output_us=0, exec_queue_us=50,
                               dispatched_unix_ns=dispatched, executor_in_unix_ns=exec_in,
                               done_unix_ns=done)  # fmt: skip
    hops = Hops(entered_ns=0, sent_ns=400_000, answered_ns=400_000 + answered - t,
                sent_wall_ns=t, answered_wall_ns=answered)  # fmt: skip
    return hops, _response(queue_us=1_000, compute_us=2_000, batch=timing)


def _count(hop: str, priority: str) -> float:
    value = REGISTRY.get_sample_value("anvil_gateway_hop_us_count", {"hop": hop, "priority": priority})
    return value or 0.0


def test_the_round_trip_is_split_into_queue_compute_and_transit() -> None:
    hops = Hops(entered_ns=1_000_000, sent_ns=1_400_000, answered_ns=9_400_000)  # 0.4 ms in, 8 ms away
    resp = _response(queue_us=2_000, compute_us=1_500)
    assert hops.split_us(resp) == (400, 2_000, 1_500, 4_500)  # type: ignore[arg-type]
    assert hops.header(resp) == "in=400,queue=2000,compute=1500,transit=4500"  # type: ignore[arg-type]
    # a queue + compute above the measured round trip (clocks of three processes) never goes negative
    assert hops.split_us(_response(queue_us=9_000, compute_us=0))[3] == 0  # type: ignore[arg-type]


def test_every_hop_is_observed_once_per_answer_under_a_bounded_priority_label() -> None:
    before = {h: _count(h, "1") for h in ("gateway_in", "transit", "gateway_out")}
    other = _count("gateway_in", "other")
    hops = Hops(entered_ns=0, sent_ns=100_000, answered_ns=600_000)
    hops.record(_response(100, 100), 1)  # type: ignore[arg-type]
    hops.record(_response(100, 100), 7)  # type: ignore[arg-type]  # not a class: one "other" series
    assert all(_count(h, "1") == before[h] + 1 for h in before)
    assert _count("gateway_in", "other") == other + 1


def test_the_answers_stamps_split_transit_per_link_and_queue() -> None:
    hops, resp = _stamped(1_700_000_000_000_000_000)
    # transit = 3.65 ms - queue 1 - compute 2 = 0.65 ms = to_scheduler 0.2 + to_executor 0.1 +
    # executor_queue 0.05 + back 0.3
    assert hops.split_us(resp)[3] == 650  # type: ignore[arg-type]
    assert hops.transit_us(resp) == (200, 100, 50, 300)  # type: ignore[arg-type]
    assert hops.header(resp) == (  # type: ignore[arg-type]
        "in=400,queue=1000,compute=2000,transit=650,to_scheduler=200,to_executor=100,executor_queue=50,back=300"
    )
    # the stamps travel through the codec unchanged (64-bit, ns)
    assert int(resp.dispatchedUnixNs) == 1_700_000_000_000_000_000 + 1_200_000  # type: ignore[attr-defined]


def test_an_answer_without_stamps_or_with_skewed_clocks_splits_nothing_or_clamps() -> None:
    hops = Hops(entered_ns=0, sent_ns=100_000, answered_ns=600_000, sent_wall_ns=5, answered_wall_ns=6)
    unstamped = _response(100, 100)  # an error answer, or an executor of an older version
    assert hops.transit_us(unstamped) is None  # type: ignore[arg-type]
    assert "to_scheduler" not in hops.header(unstamped)  # type: ignore[arg-type]
    # the scheduler's clock 1 ms behind the gateway's: its admission looks earlier than the send
    hops, resp = _stamped(1_700_000_000_000_000_000)
    hops.sent_wall_ns += 1_000_000
    assert hops.transit_us(resp)[0] == 0  # type: ignore[arg-type,index]


def test_transit_parts_are_observed_only_for_stamped_answers() -> None:
    before = {h: _count(h, "2") for h in TRANSIT_HOPS}
    hops, resp = _stamped(1_700_000_000_000_000_000)
    hops.record(resp, 2)  # type: ignore[arg-type]
    Hops(entered_ns=0, sent_ns=1, answered_ns=2).record(_response(1, 1), 2)  # type: ignore[arg-type]
    assert all(_count(h, "2") == before[h] + 1 for h in TRANSIT_HOPS)
