"""Per-hop timing at the gateway (#19): the split of a request's time that travels back in the
x-anvil-hops-us header and feeds anvil_gateway_hop_us{hop,priority}."""

from __future__ import annotations

from prometheus_client import REGISTRY

from anvil_core import codec
from anvil_gateway.hops import Hops


def _response(queue_us: int, compute_us: int) -> object:
    env = codec.build_response(
        request_id="r", trace_id="t", model="m", queue_us=queue_us, compute_us=compute_us
    )
    return codec.read_response(env)


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
