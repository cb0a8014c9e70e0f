"""FastHistogram (anvil_core.metrics) is exposed exactly as prometheus_client's Histogram of the same
name, labels and buckets (but for Histogram's ``_created`` series), for the same observations."""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from anvil_core.metrics import FastHistogram

BUCKETS = (50, 100, 250, 500, 1000, 2500, 5000)


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "_created" not in line)


def test_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastHistogram("t_hop_us", "a hop, µs", ["hop", "priority"], buckets=BUCKETS, registry=ours)
    ref = Histogram("t_hop_us", "a hop, µs", ["hop", "priority"], buckets=BUCKETS, registry=theirs)
    rng = random.Random(7)
    for _ in range(3000):
        hop, prio = rng.choice(["in", "queue", "back"]), rng.choice(["1", "2", "3"])
        # bucket edges exactly, values between them, and past the last bound (+Inf)
        v = rng.choice([50, 100, 5000, 0, rng.uniform(0, 8000), rng.uniform(1e4, 1e6)])
        if rng.random() < 0.5:
            fast.labels(hop=hop, priority=prio).observe(v)
        else:
            fast.labels(hop, prio).observe(v)
        ref.labels(hop=hop, priority=prio).observe(v)
    assert _lines(ours) == _lines(theirs)
    assert ours.get_sample_value("t_hop_us_count", {"hop": "in", "priority": "1"}) == theirs.get_sample_value(
        "t_hop_us_count", {"hop": "in", "priority": "1"}
    )


def test_labels_are_checked() -> None:
    fast = FastHistogram("t2_us", "x", ["model"], registry=CollectorRegistry())
    with pytest.raises(ValueError):
        fast.labels(model="m", extra="x")
    with pytest.raises(ValueError):
        fast.labels("a", "b")
    with pytest.raises(ValueError):
        fast.labels("m", model="m")
    with pytest.raises(ValueError):
        FastHistogram("t3_us", "x", buckets=(1, 1), registry=CollectorRegistry())


def test_threads_lose_no_observation() -> None:
    reg = CollectorRegistry()
    fast = FastHistogram("t4_us", "x", ["lane"], buckets=(10,), registry=reg)
    child = fast.labels(lane="0")

    def work() -> None:
        for _ in range(20_000):
            child.observe(5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.get_sample_value("t4_us_count", {"lane": "0"}) == 80_000
    assert reg.get_sample_value("t4_us_sum", {"lane": "0"}) == 400_000


def test_remove_drops_a_series() -> None:
    reg = CollectorRegistry()
    fast = FastHistogram("t5_us", "x", ["model"], registry=reg)
    fast.labels(model="a").observe(1)
    fast.labels(model="b").observe(2)
    fast.remove("a")
    assert reg.get_sample_value("t5_us_count", {"model": "a"}) is None
    assert reg.get_sample_value("t5_us_count", {"model": "b"}) == 1
    with pytest.raises(KeyError):
        fast.remove("a")
