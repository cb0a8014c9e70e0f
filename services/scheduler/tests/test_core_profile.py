"""Latency profile: conservative prior before data, learns from observations, exports a plain dict."""

import random

import pytest

from anvil_scheduler.core import LatencyProfile, ProfilePrior


def test_prior_is_used_before_any_data() -> None:
    prof = LatencyProfile(ProfilePrior(base_us=10_000, per_item_us=1_000))
    assert prof.predict_s(1) == pytest.approx(0.011)
    assert prof.predict_s(8) == pytest.approx(0.018)


def test_prior_decays_as_samples_arrive() -> None:
    prof = LatencyProfile(ProfilePrior(base_us=10_000, per_item_us=1_000, prior_weight=4))
    prof.observe(4, 0.002)
    first = prof.predict_s(4)
    assert 0.002 < first < 0.014  # conservative: still pulled towards the prior
    for _ in range(400):
        prof.observe(4, 0.002)
    assert prof.predict_s(4) == pytest.approx(0.002, rel=0.1)


def test_tail_not_mean_is_learned() -> None:
    prof = LatencyProfile(ProfilePrior(prior_weight=0))
    for i in range(100):
        prof.observe(2, 0.010 if i % 10 else 0.020)  # 10% slow batches
    assert prof.predict_s(2) >= 0.010
    assert prof.predict_s(2) <= 0.020


def test_unseen_sizes_come_from_a_linear_fit() -> None:
    prof = LatencyProfile(ProfilePrior(prior_weight=0))
    for b in (1, 2, 4, 8):
        for _ in range(10):
            prof.observe(b, 0.004 + 0.0005 * b)
    assert prof.predict_s(16) == pytest.approx(0.004 + 0.0005 * 16, rel=0.02)
    assert prof.predict_s(6) == pytest.approx(0.007, rel=0.02)


def test_export_and_import_round_trip_as_redis_would_return_it() -> None:
    prof = LatencyProfile(ProfilePrior(prior_weight=0))
    for _ in range(10):
        prof.observe(1, 0.004)
        prof.observe(8, 0.008)
    table = prof.export_us()
    assert table == {1: 4000, 8: 8000}
    fresh = LatencyProfile(ProfilePrior(prior_weight=0))
    fresh.load_us({str(k).encode(): str(v).encode() for k, v in table.items()})  # bytes, like redis-py
    assert fresh.predict_s(8) == pytest.approx(0.008)
    with pytest.raises(ValueError, match="batch size -> microseconds"):
        fresh.load_us({"x": "1"})


def test_observations_age_so_a_stale_outlier_cannot_freeze_the_prediction() -> None:
    now = [0.0]
    prof = LatencyProfile(ProfilePrior(base_us=10_000, per_item_us=1_000, half_life_s=10.0), lambda: now[0])
    prof.observe(1, 0.300)  # one slow batch
    for _ in range(5):
        prof.observe(1, 0.002)
    stale = prof.predict_s(1)
    assert stale > 0.1  # p90 of 6 samples is the outlier
    now[0] = 30.0  # nothing observed for 30 s (everything was shed)
    assert prof.weight(1) == pytest.approx(6 / 8)
    assert prof.predict_s(1) < stale / 2  # the prior takes back its weight
    for _ in range(3):
        prof.observe(1, 0.002)  # fresh samples outweigh the faded outlier in the tail
    assert prof.predict_s(1) < 0.011


def test_without_a_clock_nothing_ages_and_equal_weights_keep_the_old_p90() -> None:
    prof = LatencyProfile(ProfilePrior(prior_weight=0))
    for i in range(11):
        prof.observe(1, float(i))
    assert prof.predict_s(1) == 9.0  # sorted index int(0.9 * 11) = 9


def _naive_tail(samples: list[tuple[float, float]], now_s: float, prior: ProfilePrior) -> float:
    """The weighted p90 computed from scratch at ``now_s`` (what the profile did per call before #19)."""
    ordered = sorted((x, 0.5 ** ((now_s - t) / prior.half_life_s)) for t, x in samples)
    goal, acc = prior.tail_quantile * sum(w for _, w in ordered), 0.0
    for x, w in ordered:
        acc += w
        if acc > goal * (1 + 1e-12):
            return x
    return ordered[-1][0]


def test_cached_tail_equals_the_tail_recomputed_at_every_clock_reading() -> None:
    """The tail is cached per size between observations (#19: 28% of the scheduler's busy time): a
    quantile does not depend on the clock, because ageing scales every weight by the same factor."""
    rng = random.Random(5)
    now = [1_000_000.0]  # a monotonic clock far from 0: 2 ** (t / h) must not overflow
    prior = ProfilePrior(prior_weight=0.0)  # the prediction is then the tail itself
    prof = LatencyProfile(prior, clock=lambda: now[0])
    kept: list[tuple[float, float]] = []
    for _ in range(300):
        now[0] += rng.expovariate(2.0)  # mean 0.5 s between batches, so weights differ widely
        x = rng.lognormvariate(-5, 0.5)
        prof.observe(8, x)
        kept = [*kept, (now[0], x)][-prior.window :]
        for later in (0.0, 3.0, 40.0):  # predictions later in time, without new samples
            now[0] += later
            assert prof.predict_s(8) == _naive_tail(kept, now[0], prior)


def test_a_size_seen_once_leans_on_the_fit_of_the_others_not_on_the_bare_prior() -> None:
    """#19: after a burst, B = 16 seen once (1 ms) was predicted at ~21 ms (80% of the 26 ms prior)
    although sizes 1 and 2, seen hundreds of times, put the model at ~0.1 ms per request."""
    prof = LatencyProfile(ProfilePrior())
    for _ in range(200):
        prof.observe(1, 0.0002)
        prof.observe(2, 0.0003)
    prof.observe(16, 0.001)
    prior_16 = ProfilePrior().predict_s(16)
    assert prof.predict_s(16) < prior_16 / 10
    assert prof.predict_s(16) > prof.predict_s(2)  # still ordered by size


def test_rare_sizes_recover_with_size_1_once_the_device_is_fast_again() -> None:
    """The live stack under a CPU hog (#19): batches of 2-4 were measured slow while the hog ran and
    hardly formed after it, so their tails (and the fit through them) stayed at the hog's level while
    batches of one were fast again; the work-ahead test then shed priority 1 after the hog had gone.
    A batch of B never costs more than B batches of one: fresh size-1 samples bound the stale sizes."""
    now = [0.0]
    prof = LatencyProfile(ProfilePrior(), clock=lambda: now[0])
    for i in range(200):  # 10 s under the hog: B=1 ~12 ms, B=2-4 ~40 ms
        now[0] = i * 0.05
        prof.observe(1 + i % 4, 0.012 if i % 4 == 0 else 0.040)
    assert prof.predict_s(2) > 0.020  # slow while the hog runs
    for i in range(64):  # the hog stops: 3 s of lone requests at 2 ms
        now[0] = 10.0 + i * 0.05
        prof.observe(1, 0.002)
    one = prof.predict_s(1)
    assert one < 0.003  # the window of size 1 has turned over (the prior still weighs a little)
    assert prof.predict_s(2) <= 2 * one + 1e-12 and prof.predict_s(8) <= 8 * one + 1e-12
