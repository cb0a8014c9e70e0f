"""Calibration as a pure function of calm ticks: learned thresholds, floors, ceilings, bounds."""

from __future__ import annotations

import pytest

from anvil_qos.baseline import Band, Calibrator
from anvil_qos.policy import Action, Policy
from anvil_qos.rates import BaseRate, SloReading
from anvil_qos.signals import Measure

BANDS = {"runq_p99_us": Band(1000.0, 20000.0), "runq_mean_us": Band(100.0, 5000.0)}


def ticks(cal: Calibrator, values: list[float], subject: str = "executor:e1") -> None:
    for v in values:
        cal.learn([Measure("runq_p99_us", subject, v), Measure("cpu_cores", subject, 0.5)])


def test_ceiling_until_ready_then_relative_to_the_calm_level() -> None:
    cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=5, capacity=50)
    assert cal.threshold("runq_p99_us", "executor:e1") == 20000.0  # nothing learned: ceiling only
    ticks(cal, [4000.0] * 4)
    assert cal.threshold("runq_p99_us", "executor:e1") == 20000.0
    ticks(cal, [4000.0, 4100.0, 3900.0])  # an AMD-like host: ~4 ms calm p99
    b = cal.baseline("runq_p99_us", "executor:e1")
    assert b.ready and b.median == 4000.0 and b.mad == 0.0 and b.threshold == 8000.0
    assert "cpu_cores" not in {n for n, _ in cal.thresholds([Measure("cpu_cores", "executor:e1", 1.0)])}


def test_floor_and_ceiling_bound_what_is_learned() -> None:
    cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=3, capacity=10)
    ticks(cal, [10.0, 12.0, 11.0], "executor:quiet")  # an Intel-like host: ~10 µs calm p99
    assert cal.threshold("runq_p99_us", "executor:quiet") == 1000.0  # the floor
    ticks(cal, [9000.0, 12000.0, 15000.0], "executor:noisy")
    assert cal.threshold("runq_p99_us", "executor:noisy") == 20000.0  # the ceiling


def test_pressure_is_never_learned_and_memory_is_bounded() -> None:
    cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=3, capacity=4)
    ticks(cal, [500.0, 600.0, 700.0])
    before = cal.threshold("runq_p99_us", "executor:e1")
    ticks(cal, [9000.0] * 20)  # a hog while p1 still looked healthy: over the threshold, skipped
    assert cal.threshold("runq_p99_us", "executor:e1") == before
    ticks(cal, [800.0] * 10)
    b = cal.baseline("runq_p99_us", "executor:e1")
    assert b.samples == 4 and b.median == 800.0  # the ring keeps the last `capacity` values
    cal.retain(["executor:other"])
    assert cal.baselines() == []  # targets that left are forgotten


def test_robust_to_a_spike_in_the_calm_window() -> None:
    cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=10, capacity=100)
    ticks(cal, [100.0 + i for i in range(20)] + [5000.0])  # one outlier among 21 calm ticks
    b = cal.baseline("runq_p99_us", "executor:e1")
    assert b.median == pytest.approx(110.0, abs=0.5) and b.threshold == 1000.0  # the spike moved nothing


def test_policy_acts_on_pressure_relative_to_the_learned_level() -> None:
    cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=3, capacity=10)
    bases = {"acme:3": BaseRate(100.0, 10)}
    at_risk = {1: SloReading(0.9, 45.0, 500, 9.5)}
    for host_calm, hog in ((4000.0, 6000.0), (50.0, 6000.0)):
        cal = Calibrator(BANDS, ratio=2.0, sigmas=4.0, min_samples=3, capacity=10)
        ticks(cal, [host_calm] * 3)
        pol = Policy()
        pol.step(0.0, {}, [], bases)
        m = [Measure("runq_p99_us", "executor:e1", hog)]
        d = pol.step(10.0, at_risk, m, bases, cal.thresholds(m))
        # 6 ms is no news on a host calm at 4 ms (threshold 8 ms) and pressure on one calm at 50 µs.
        assert [x.action for x in d] == [Action.UNEXPLAINED if host_calm == 4000.0 else Action.DECREASE]
        assert pol.settled(10.0, 5.0) is False  # p1 at risk: nothing is learned now
