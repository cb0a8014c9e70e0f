"""SLOTracker's p99 from its float64 window (core/slo.py) against the definition: the nearest-rank
p99 of the latencies of the answers with a result whose answer time is inside the window."""

from __future__ import annotations

import math
import random

import pytest

from anvil_scheduler.core import SLOTracker


def _reference_p99(answers: list[tuple[float, float | None]], now_s: float, window_s: float) -> float | None:
    kept = sorted(lat for at, lat in answers if at > now_s - window_s and lat is not None)
    return kept[max(0, math.ceil(0.99 * len(kept)) - 1)] if kept else None


@pytest.mark.parametrize("seed", range(6))
def test_p99_matches_the_definition_through_growth_and_trims(seed: int) -> None:
    rng = random.Random(seed)
    window_s = rng.choice([0.05, 0.5, 2.0])
    slo = SLOTracker(window_s=window_s)
    answers: list[tuple[float, float | None]] = []
    now = 0.0
    for step in range(6000):  # several times the arrays' first capacity, with the window sliding
        now += rng.expovariate(2000.0 if step % 1500 < 1000 else 50.0)  # bursts, then gaps
        latency = None if rng.random() < 0.1 else rng.lognormvariate(-6.0, 1.0)
        slo.record(1, latency is not None, now, latency)
        answers.append((now, latency))
        if step % 97 == 0:
            assert slo.p99_s(1, now) == _reference_p99(answers, now, window_s)
    later = now + window_s / 2
    assert slo.p99_s(1, later) == _reference_p99(answers, later, window_s)
    assert slo.p99_s(1, now + window_s + 1.0) is None  # everything left the window
    assert slo.attainment(1, now + window_s + 1.0) is None


def test_p99_ignores_answers_without_a_result_and_nan() -> None:
    slo = SLOTracker(window_s=10.0)
    slo.record(2, False, 1.0)  # shed: no latency
    slo.record(2, True, 1.0, math.nan)
    assert slo.p99_s(2, 1.0) is None
    slo.record(2, True, 1.5, 0.004)
    assert slo.p99_s(2, 1.5) == 0.004
    assert slo.attainment(2, 1.5) == 2 / 3
