"""Online latency profile: predicted execution time of a batch of B on one (model, device).

Per batch size the profile keeps the last ``window`` observed execution times and predicts their p90
(a tail estimate: the scheduler uses it to promise deadlines, so the mean would be optimistic half the
time). Before data exists it answers with a conservative prior ``base + per_item * B``; the prior's
weight decays as samples arrive (``n / (n + prior_weight)``). Sizes never seen are extrapolated with a
least-squares fit ``a + b*B`` over the observed sizes.

Observations age: each weighs ``2 ** (-age / half_life_s)``, in the tail (a weighted p90) and in ``n``.
A prediction therefore cannot freeze: if it sheds every request, no new observation comes, but the old
ones fade and the prior takes back its weight, until a request is admitted and measured again (issue
#22: one 300 ms first batch locked priority 2 of a model out for good). The clock is the book's,
advanced by the core (``ProfileBook.tick``). Export/import is a plain ``{B: microseconds}``
dict, the shape of the Redis hash ``anvil:profile:{model}:{device}``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping
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
    # An observation loses half its weight every half_life_s. Under load it changes nothing (a window of
    # 64 batches is well under a second); an idle or fully shed model forgets a stale outlier: after
    # 30 s it weighs 1/8, and the prior (which any model we serve beats) is back to ~1/3 of the blend.
    half_life_s: float = 10.0

    def __post_init__(self) -> None:
        if self.base_us < 0 or self.per_item_us < 0:
            raise ValueError("prior base_us and per_item_us must be >= 0")
        if not 0 < self.tail_quantile <= 1:
            raise ValueError(f"tail_quantile must be in (0, 1], got {self.tail_quantile}")
        if self.window < 1 or self.prior_weight < 0:
            raise ValueError("window must be >= 1 and prior_weight >= 0")
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0 (math.inf: no decay), got {self.half_life_s}")

    def predict_s(self, batch_size: int) -> float:
        return (self.base_us + self.per_item_us * batch_size) / 1e6


class LatencyProfile:
    """Execution-time model of one (model, device). ``clock`` gives the time observations age against
    (seconds, the scheduler's clock); without one nothing ages."""

    def __init__(self, prior: ProfilePrior | None = None, clock: Callable[[], float] | None = None) -> None:
        self.prior = prior or ProfilePrior()
        self._clock = clock or _no_clock
        self._samples: dict[int, _Bucket] = {}  # size -> its last `window` (observed at s, exec s)
        self._counts: dict[int, int] = {}
        self._mass: dict[int, tuple[float, float]] = {}  # size -> (decayed sample count, as of time s)
        self._cache: dict[int, float] = {}
        # size -> weighted tail of its bucket. A tail does not depend on the clock: every sample's weight
        # 2 ** (-(now - t) / h) = 2 ** (-now / h) * 2 ** (t / h) shares the first factor, which the
        # quantile cancels. So it changes only when that size is observed (the profile of the H200 stack
        # spent 28% of the scheduler's busy time re-sorting and re-decaying every bucket per batch).
        self._tails: dict[int, float] = {}
        self._fit: tuple[float, float] | None = None
        # Cached predictions hold for 1/16 of a half-life (weights move < 5% meanwhile).
        self._epoch_s = self.prior.half_life_s / 16
        self._epoch = -1

    def observe(self, batch_size: int, exec_s: float, now_s: float | None = None) -> None:
        """Record one measured execution (seconds, as timed by the executor) at ``now_s`` (default:
        the clock's now)."""
        if batch_size < 1 or exec_s < 0:
            raise ValueError(f"bad observation: batch_size={batch_size}, exec_s={exec_s}")
        t = self._clock() if now_s is None else now_s
        bucket = self._samples.get(batch_size)
        if bucket is None:
            bucket = self._samples[batch_size] = _Bucket(self.prior.window, self.prior.half_life_s)
        bucket.add(t, exec_s)
        self._counts[batch_size] = self._counts.get(batch_size, 0) + 1
        self._mass[batch_size] = (self._weight_of(batch_size, t) + 1.0, t)
        self._tails.pop(batch_size, None)
        # What this sample moves: its own size's prediction, and every unseen size's (the fit); a sample
        # of size 1 moves every size's sequential bound.
        if batch_size == 1:
            self._cache.clear()
        for size in [b for b in self._cache if b == batch_size or b not in self._samples]:
            del self._cache[size]
        self._fit = None

    def samples(self, batch_size: int) -> int:
        """Observations of ``batch_size`` ever recorded (not decayed)."""
        return self._counts.get(batch_size, 0)

    def weight(self, batch_size: int) -> float:
        """Decayed number of observations of ``batch_size`` as of the clock's now."""
        return self._weight_of(batch_size, self._clock())

    def _weight_of(self, batch_size: int, now_s: float) -> float:
        n, at = self._mass.get(batch_size, (0.0, now_s))
        return n * self._decay(now_s - at)

    def _decay(self, age_s: float) -> float:
        return float(0.5 ** (max(age_s, 0.0) / self.prior.half_life_s))

    def predict_s(self, batch_size: int) -> float:
        """Predicted (tail) execution time of a batch of ``batch_size``, in seconds."""
        now = self._clock()
        epoch = int(now / self._epoch_s) if math.isfinite(self._epoch_s) else 0
        if epoch != self._epoch:
            self._epoch = epoch
            self._cache.clear()
            self._fit = None
        hit = self._cache.get(batch_size)
        if hit is not None:
            return hit
        # What the profile says without this size's own samples: the fit over every observed size,
        # blended with the prior by their total weight (the prior alone before any data).
        fallback = self.prior.predict_s(batch_size)
        if self._samples:
            a, b = self._line(now)
            total = sum(self._weight_of(size, now) for size in self._samples)
            w_all = total / (total + self.prior.prior_weight) if total else 0.0
            fallback = w_all * (a + b * batch_size) + (1.0 - w_all) * fallback
        bucket = self._samples.get(batch_size)
        value = fallback
        if bucket:
            # A size seen a few times leans on the fallback, not on the bare prior: large batches form
            # only in bursts, and a prior of 10 ms + 1 ms per request kept a CPU model whose batches
            # take 0.2 ms predicted at 16-27 ms for B 13-22 after a burst (#19), which shrank B* and
            # made the work-ahead test shed. (The fallback part of a cached seen size refreshes each
            # cache epoch, not at every other size's observation.)
            n = self._weight_of(batch_size, now)
            w = n / (n + self.prior.prior_weight) if n else 0.0
            value = w * self._tail_of(batch_size, bucket) + (1.0 - w) * fallback
        if batch_size > 1:
            # Sequential bound: a batch of B never costs more than B batches of one run in a row. Size 1
            # is the size measured most often (every lone request), so the bound carries its freshness
            # to the rarer sizes: on the live stack a CPU hog left batches of 2-6 predicted at 17-45 ms
            # for 10 s after it stopped, while batches of one were back at 2-3 ms (#19).
            value = min(value, batch_size * self.predict_s(1))
        self._cache[batch_size] = value
        return value

    def _tail_of(self, batch_size: int, bucket: _Bucket) -> float:
        hit = self._tails.get(batch_size)
        if hit is None:
            hit = self._tails[batch_size] = bucket.tail(self.prior.tail_quantile)
        return hit

    def _line(self, now_s: float) -> tuple[float, float]:
        """Weighted least squares a + b*B over the observed sizes' tails (b >= 0, a >= 0)."""
        if self._fit is not None:
            return self._fit
        pts = [
            (float(b), self._tail_of(b, s), max(self._weight_of(b, now_s), 1e-9))
            for b, s in self._samples.items()
        ]
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


def _no_clock() -> float:
    return 0.0


class _Bucket:
    """The last ``window`` observations of one batch size, kept twice: in arrival order (for eviction)
    and sorted by time (for the quantile), each with its weight 2 ** ((t - anchor) / half_life). Ageing
    scales every weight alike, so these weights give the same quantile as the aged ones at any clock
    reading: a new sample costs an insort and the tail a scan, not a sort and 64 powers (#19)."""

    __slots__ = ("_anchor", "_by_x", "_half_life_s", "_order", "_total", "_window")

    def __init__(self, window: int, half_life_s: float) -> None:
        self._window = window
        self._half_life_s = half_life_s
        self._order: deque[tuple[float, float, float]] = deque()  # (x, weight, t), oldest first
        self._by_x: list[tuple[float, float, float]] = []  # the same entries, sorted
        self._total = 0.0
        self._anchor: float | None = None

    def __len__(self) -> int:
        return len(self._order)

    def add(self, t: float, x: float) -> None:
        # Re-anchor before weights leave float range (2 ** 60 is far inside it; once per 600 s at 10 s).
        if self._anchor is None or (t - self._anchor) / self._half_life_s > 60:
            self._reanchor(t)
        assert self._anchor is not None
        if len(self._order) == self._window:
            old = self._order.popleft()
            del self._by_x[bisect.bisect_left(self._by_x, old)]
            self._total -= old[1]
        entry = (x, float(2.0 ** ((t - self._anchor) / self._half_life_s)), t)
        self._order.append(entry)
        bisect.insort(self._by_x, entry)
        self._total += entry[1]

    def _reanchor(self, t: float) -> None:
        self._anchor = t
        entries = [(x, float(2.0 ** ((at - t) / self._half_life_s)), at) for x, _, at in self._order]
        self._order = deque(entries)
        self._by_x = sorted(entries)
        self._total = sum(w for _, w, _ in entries)

    def tail(self, q: float) -> float:
        """Weighted ``q`` quantile: with equal weights, the sample at sorted index int(q * n)."""
        goal, acc = q * self._total * (1 + 1e-12), 0.0
        for x, w, _ in self._by_x:
            acc += w
            if acc > goal:
                return x
        return self._by_x[-1][0]


class ProfileBook:
    """All profiles of one scheduler, keyed by (model, device); created on first use with the prior.
    Its clock is the core's: ``tick(now_s)`` on every core call, so observations age in real time in
    the service and in simulated time in the simulator."""

    def __init__(self, prior: ProfilePrior | None = None) -> None:
        self.prior = prior or ProfilePrior()
        self._profiles: dict[tuple[str, str], LatencyProfile] = {}
        self.now_s = 0.0

    def tick(self, now_s: float) -> None:
        self.now_s = now_s

    def get(self, model: str, device: str) -> LatencyProfile:
        key = (model, device)
        prof = self._profiles.get(key)
        if prof is None:
            prof = self._profiles[key] = LatencyProfile(self.prior, self._now)
        return prof

    def predict_s(self, model: str, device: str, batch_size: int) -> float:
        return self.get(model, device).predict_s(batch_size)

    def _now(self) -> float:
        return self.now_s

    def keys(self) -> list[tuple[str, str]]:
        return list(self._profiles)

    def forget(self, model: str) -> None:
        """Drop every profile of ``model`` (undeployed: a model of that name later starts afresh)."""
        for key in [k for k in self._profiles if k[0] == model]:
            del self._profiles[key]
