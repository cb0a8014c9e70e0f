"""The AIMD policy as a pure function of its inputs, with an injected clock (no BPF, no Redis)."""

from __future__ import annotations

import json

import pytest

from anvil_qos.metrics import Exporter, decisions_total
from anvil_qos.policy import Action, Decision, Policy, PolicyConfig
from anvil_qos.rates import BaseRate, SloReading
from anvil_qos.signals import Measure

CFG = PolicyConfig(md_interval_s=1.0, ai_interval_s=1.0, hold_s=5.0, ai_step_frac=0.1, floor_frac=0.05)
BASES = {
    "gold:1": BaseRate(100.0, 20),
    "acme:2": BaseRate(100.0, 20),
    "acme:3": BaseRate(200.0, 40),
    "bulk:3": BaseRate(50.0, 10),
    "gold:*": BaseRate(500.0, 50),
}
HOT = [Measure("runq_p99_us", "executor:e1", 4000.0)]  # 2x the 2000 µs threshold
WARM = [Measure("runq_p99_us", "executor:e1", 1500.0)]  # under threshold, over the clear level
COOL = [Measure("runq_p99_us", "executor:e1", 300.0), Measure("cpu_cores", "executor:e1", 0.9)]


def p1(now: float, attainment: float, p99_ms: float = 10.0, requests: int = 500) -> dict[int, SloReading]:
    return {1: SloReading(attainment, p99_ms, requests, now - 0.5), 3: SloReading(0.5, 900.0, 50, now)}


def rates(d: list[Decision]) -> dict[str, float]:
    return {x.key: x.rate_rps for x in d if x.key}


@pytest.fixture
def policy() -> Policy:
    pol = Policy(CFG)
    first = pol.step(0.0, {}, [], BASES)
    assert {d.action for d in first} == {Action.BASE}
    assert rates(first) == {k: b.rate_rps for k, b in BASES.items()}
    return pol


def test_decrease_lowest_class_first_on_p1_drop_with_pressure(policy: Policy) -> None:
    d = policy.step(10.0, p1(10.0, 0.95), HOT, BASES)
    assert rates(d) == {"acme:3": 100.0, "bulk:3": 25.0}  # halved; p2 untouched while p3 can give
    assert {x.action for x in d} == {Action.DECREASE}
    assert all(x.cause == "cpu_runqueue" for x in d)
    assert "runq_p99_us executor:e1 4000 > 2000" in d[0].reason and "attainment 0.950" in d[0].reason
    assert d[0].burst == 20 and d[0].prev_rate_rps == 200.0  # burst scales with the rate

    assert policy.step(10.5, p1(10.5, 0.95), HOT, BASES) == []  # md_interval_s: one cut per second
    for t in range(11, 16):  # down to the floor (5% of base), then p2 starts to give
        d = policy.step(float(t), p1(float(t), 0.95), HOT, BASES)
    assert policy.rates["acme:3"] == pytest.approx(10.0) and policy.rates["bulk:3"] == pytest.approx(2.5)
    assert rates(d) == {"acme:2": 50.0}


def test_headroom_drop_also_counts_as_risk(policy: Policy) -> None:
    d = policy.step(
        10.0, p1(10.0, 1.0, p99_ms=45.0), [Measure("retransmits_per_s", "port:8000", 40.0)], BASES
    )
    assert rates(d) == {"acme:3": 100.0, "bulk:3": 25.0}
    assert d[0].cause == "tcp_retransmits" and "headroom 0.10" in d[0].reason


def test_no_action_without_an_explaining_pressure(policy: Policy) -> None:
    d = policy.step(10.0, p1(10.0, 0.90), COOL, BASES)
    assert [x.action for x in d] == [Action.UNEXPLAINED]
    assert d[0].key == "" and d[0].cause == "none" and "no pressure signal" in d[0].reason
    assert policy.step(11.0, p1(11.0, 0.90), COOL, BASES) == []  # said once per unexplained_every_s
    assert policy.rates["acme:3"] == 200.0


def test_readings_without_requests_or_p99_are_judged_on_attainment(policy: Policy) -> None:
    bare = {1: SloReading(0.9, None, None, 9.5)}  # what the scheduler publishes today
    assert rates(policy.step(10.0, bare, HOT, BASES)) == {"acme:3": 100.0, "bulk:3": 25.0}


def test_pressure_without_an_slo_problem_changes_nothing(policy: Policy) -> None:
    assert policy.step(10.0, p1(10.0, 1.0), HOT, BASES) == []
    assert policy.step(11.0, p1(11.0, 0.5, requests=5), HOT, BASES) == []  # too few requests to judge


def test_p1_and_tenant_wildcards_are_never_throttled(policy: Policy) -> None:
    for t in range(10, 40):
        for d in policy.step(float(t), p1(float(t), 0.5), HOT, BASES):
            assert d.key not in ("gold:1", "gold:*")
    assert policy.rates["gold:1"] == 100.0 and policy.rates["gold:*"] == 500.0
    assert policy.rates["acme:2"] == pytest.approx(5.0)  # everything else reached its floor


def test_additive_restore_after_hold_with_hysteresis(policy: Policy) -> None:
    for t in (10.0, 11.0, 12.0):
        policy.step(t, p1(t, 0.9), HOT, BASES)
    assert policy.rates["acme:3"] == 25.0
    # Healthy SLO but the pressure is only under its threshold, not under the clear level: hold.
    assert policy.step(13.0, p1(13.0, 1.0), WARM, BASES) == []
    # Calm from 14 s: nothing until the 5 s hold has passed.
    for t in range(14, 19):
        assert policy.step(float(t), p1(float(t), 1.0), COOL, BASES) == []
    d = policy.step(19.0, p1(19.0, 1.0), COOL, BASES)
    assert rates(d) == {"acme:3": 45.0, "bulk:3": 11.25}  # + 10% of base each
    assert {x.action for x in d} == {Action.INCREASE} and d[0].cause == "healthy"
    assert policy.step(19.5, p1(19.5, 1.0), COOL, BASES) == []  # ai_interval_s
    # A "watch" reading (between at-risk and healthy) restarts the hold.
    assert policy.step(20.0, p1(20.0, 0.992), COOL, BASES) == []
    assert policy.step(21.0, p1(21.0, 1.0), COOL, BASES) == []
    for t in range(22, 26):
        assert policy.step(float(t), p1(float(t), 1.0), COOL, BASES) == []
    assert rates(policy.step(26.0, p1(26.0, 1.0), COOL, BASES)) == {"acme:3": 65.0, "bulk:3": 16.25}
    for t in range(27, 40):
        policy.step(float(t), p1(float(t), 1.0), COOL, BASES)
    assert policy.rates == {k: b.rate_rps for k, b in BASES.items()}  # capped at base
    assert policy.step(40.0, p1(40.0, 1.0), COOL, BASES) == []


def test_restore_when_the_slo_reading_goes_stale(policy: Policy) -> None:
    policy.step(10.0, p1(10.0, 0.9), HOT, BASES)
    assert policy.rates["acme:3"] == 100.0
    for t in range(11, 30):  # the scheduler stopped publishing: fail open
        policy.step(float(t), p1(10.0, 0.9), COOL, BASES)
    assert policy.rates["acme:3"] == 200.0


def test_base_changes_and_removal(policy: Policy) -> None:
    policy.step(10.0, p1(10.0, 0.9), HOT, BASES)
    bases = dict(BASES, **{"acme:3": BaseRate(400.0, 80)})
    del bases["bulk:3"]
    d = policy.step(11.0, {}, COOL, bases)
    by_key = {x.key: x for x in d}
    assert by_key["bulk:3"].action == Action.REMOVE
    assert by_key["acme:3"].action == Action.BASE and by_key["acme:3"].rate_rps == 100.0  # throttle kept
    assert "bulk:3" not in policy.rates


def test_adopt_resumes_a_previous_throttle() -> None:
    pol = Policy(CFG)
    pol.adopt({"acme:3": 30.0, "gold:1": 1.0})
    d = pol.step(0.0, {}, [], BASES)
    assert rates(d)["acme:3"] == 30.0 and rates(d)["gold:1"] == 100.0


def test_decisions_serialize_and_count() -> None:
    pol = Policy(CFG)
    pol.step(0.0, {}, [], BASES)
    (d, _) = pol.step(10.0, p1(10.0, 0.9), HOT, BASES)
    limit = json.loads(d.limit_json())
    assert limit == {"rate_rps": 100.0, "burst": 20, "reason": d.reason, "ts": 10.0}
    assert d.reason.startswith("qos:")
    event = d.event()
    assert event["event"] == "qos.decrease" and event["key"] == "acme:3" and event["cause"] == "cpu_runqueue"
    before = decisions_total.labels(action="decrease", cause="cpu_runqueue")._value.get()
    Exporter.decided(d)
    assert decisions_total.labels(action="decrease", cause="cpu_runqueue")._value.get() == before + 1


def test_config_is_validated() -> None:
    with pytest.raises(AssertionError):
        PolicyConfig(md_factor=1.5)
