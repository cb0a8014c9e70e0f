"""Online latency profile: predicted execution time of a batch of B on one (model, device).

Per batch size the profile keeps the last ``window`` observed execution times and predicts their p90
(a tail estimate: the scheduler uses it to promise deadlines, so the mean would be optimistic half the
time). Before data exists it answers with a conservative prior ``base + per_item * B``; the prior's
weight decays as samples arrive (``n / (n + prior_weight)``). Sizes never seen are extrapolated with a
least-squares fit ``a + b*B`` over the observed sizes. Export/import is a plain ``{B: microseconds}``
dict, the shape of the Redis hash ``anvil:profile:{model}:{device}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LatencyProfile", "ProfileBook", "ProfilePrior"]


@dataclass(frozen=True)
class ProfilePrior:
    # Deliberately pessimistic so that a cold scheduler sheds and batches conservatively: 10 ms + 1 ms per
    # request is slower than any model Anvil serves at batch 1 on a GPU; the first batches correct it.
    base_us: float = 10_000.0
    per_item_us: float = 1_000.0
    # The prior counts as this many samples; after 4x as many observations it weighs 20%.
    prior_weight: float = 4.0
    # Observations kept per batch size: enough for a stable p90, short enough to follow drift (~1 s of
    # batches at full load).
    window: int = 64
    tail_quantile: float = 0.9

    def __post_init__(self) -> None:
        if self.base_us < 0 or self.per_item_us < 0:
            raise ValueError("prior base_us and per_item_us must be >= 0")
        if not 0 < self.tail_quantile <= 1:
            raise ValueError(f"tail_quantile must be in (0, 1], got {self.tail_quantile}")
        if self.window < 1 or self.prior_weight < 0:
            raise ValueError("window must be >= 1 and prior_weight >= 0")

    def predict_s(self, batch_size: int) -> float:
        return (self.base_us + self.per_item_us * batch_size) / 1e6


class LatencyProfile:
    """Execution-time model of one (model, device)."""

    def __init__(self, prior: ProfilePrior | None = None) -> None:
        self.prior = prior or ProfilePrior()
        self._samples: dict[int, deque[float]] = {}
        self._counts: dict[int, int] = {}
        self._cache: dict[int, float] = {}
        self._fit: tuple[float, float] | None = None

    def observe(self, batch_size: int, exec_s: float) -> None:
        """Record one measured execution (seconds, as timed by the executor)."""
        if batch_size < 1 or exec_s < 0:
            raise ValueError(f"bad observation: batch_size={batch_size}, exec_s={exec_s}")
        self._samples.setdefault(batch_size, deque(maxlen=self.prior.window)).append(exec_s)
        self._counts[batch_size] = self._counts.get(batch_size, 0) + 1
        self._cache.clear()
        self._fit = None

    def samples(self, batch_size: int) -> int:
        return self._counts.get(batch_size, 0)

    def predict_s(self, batch_size: int) -> float:
        """Predicted (tail) execution time of a batch of ``batch_size``, in seconds."""
        hit = self._cache.get(batch_size)
        if hit is not None:
            return hit
        bucket = self._samples.get(batch_size)
        if bucket:
            learned, n = self._tail(bucket), float(self._counts[batch_size])
        elif self._samples:
            a, b = self._line()
            learned = a + b * batch_size
            n = float(sum(self._counts.values()))
        else:
            learned, n = 0.0, 0.0
        w = n / (n + self.prior.prior_weight) if n else 0.0
        value = w * learned + (1.0 - w) * self.prior.predict_s(batch_size)
        self._cache[batch_size] = value
        return value

    def _tail(self, bucket: deque[float]) -> float:
        ordered = sorted(bucket)
        return ordered[min(len(ordered) - 1, int(self.prior.tail_quantile * len(ordered)))]

    def _line(self) -> tuple[float, float]:
        """Weighted least squares a + b*B over the observed sizes' tails (b >= 0, a >= 0)."""
        if self._fit is not None:
            return self._fit
        pts = [(float(b), self._tail(s), float(len(s))) for b, s in self._samples.items()]
        if len(pts) == 1:
            size, t, _ = pts[0]
            slope = self.prior.per_item_us / 1e6  # one size seen: borrow the prior's slope
            self._fit = (max(t - slope * size, 0.0), slope)
            return self._fit
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        slope = max(sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx, 0.0) if sxx else 0.0
        self._fit = (max(my - slope * mx, 0.0), slope)
        return self._fit

    def export_us(self) -> dict[int, int]:
        """Observed sizes -> predicted latency in microseconds (the Redis hash's content)."""
        return {b: round(self.predict_s(b) * 1e6) for b in sorted(self._samples)}

    def load_us(self, table: Mapping[Any, Any], weight: int = 8) -> None:
        """Seed from an exported table (keys and values may be int, float, str or bytes, as Redis gives
        them). Each entry counts as ``weight`` observations, so fresh measurements take over quickly."""
        for key, value in table.items():
            try:
                size, us = int(key), float(value)
            except (TypeError, ValueError):
                msg = f"profile entry {key!r}: {value!r} is not batch size -> microseconds"
                raise ValueError(msg) from None
            if size < 1 or us < 0:
                raise ValueError(f"profile entry {key!r}: {value!r} needs batch size >= 1 and latency >= 0")
            for _ in range(weight):
                self.observe(size, us / 1e6)


class ProfileBook:
    """All profiles of one scheduler, keyed by (model, device); created on first use with the prior."""

    def __init__(self, prior: ProfilePrior | None = None) -> None:
        self.prior = prior or ProfilePrior()
        self._profiles: dict[tuple[str, str], LatencyProfile] = {}

    def get(self, model: str, device: str) -> LatencyProfile:
        key = (model, device)
        prof = self._profiles.get(key)
        if prof is None:
            prof = self._profiles[key] = LatencyProfile(self.prior)
        return prof

    def predict_s(self, model: str, device: str, batch_size: int) -> float:
        return self.get(model, device).predict_s(batch_size)

    def keys(self) -> list[tuple[str, str]]:
        return list(self._profiles)
