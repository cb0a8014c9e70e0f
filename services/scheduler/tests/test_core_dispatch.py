"""ExecutorPool.predict_finish: with one executor of the model it is computed in closed form (admission
runs it per arrival, #19); it must equal the batch-by-batch drain it replaces."""

from __future__ import annotations

import random

from anvil_scheduler.core import ExecutorSpec
from anvil_scheduler.core.dispatch import ExecutorPool


def _drained(position: int, cap: int, ready_s: float, predict: object) -> float:
    """The generic drain: full batches while more than one batch is left, at most 256, then fluid."""
    assert callable(predict)
    full, remaining = predict("cpu", cap), position
    for _ in range(256):
        if remaining <= cap:
            return float(ready_s + predict("cpu", remaining))
        ready_s += full
        remaining -= cap
    return float(ready_s + remaining / (cap / full))


def test_one_host_closed_form_equals_the_drain() -> None:
    pool = ExecutorPool()
    pool.register(ExecutorSpec("e0", "cpu", 32, frozenset({"m"}), 2))
    pool.register(ExecutorSpec("e1", "cpu", 32, frozenset({"other"}), 2))  # hosts another model only

    def predict(device: str, b: int) -> float:
        return 0.004 + 0.001 * b

    rng = random.Random(7)
    for _ in range(500):
        position, cap = rng.randint(1, 12_000), rng.randint(1, 40)
        got = pool.predict_finish("m", position, cap, predict, 1.0)
        assert abs(got - _drained(position, min(cap, 32), 1.0, predict)) < 1e-9, (position, cap)
