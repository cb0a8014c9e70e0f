"""Per-target healthy baselines of the pressure measures, and the thresholds they imply (pure; no I/O).

Hosts of one kind differ (docs/qos.md, "Calibration"): an idle process on one 2-vCPU VM showed a
run-queue p99 of ~0.1 ms, on another ~4 ms. So qos learns, per (measure, subject), what "calm" looks
like on its own host and calls a measure pressure when it rises well above that:

    threshold = clamp(max(ratio x median, median + sigmas x 1.4826 x MAD), floor, ceiling)

(a rise to `ratio` times the calm level, and out of the calm noise: a noisy host needs more.)

- **What is learned**: the median and MAD (median absolute deviation; x 1.4826 it estimates a standard
  deviation, robust to the odd spike) of the last `capacity` calm values of the measure, one value per
  tick. Calm is decided by the caller (the service: p1 healthy, no limit below its base, no decrease
  lately); a value that is itself over the current threshold is never learned, so pressure cannot
  teach qos that pressure is normal.
- **How fast**: a baseline is ready after `min_samples` calm ticks (20 x 500 ms = 10 s by default);
  until then the threshold is the ceiling (only absolute pressure counts).
- **Bounded**: a ring of `capacity` floats per (measure, subject) (240 = 2 min of ticks); baselines
  of targets that leave are dropped; a restart relearns from nothing (nothing is persisted).
- **Floors and ceilings** are typed settings (units in their names): below the floor a measure is
  never pressure (a 0.2 ms p99 is no problem however calm the host was), above the ceiling always.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from anvil_qos.signals import Measure

__all__ = ["Band", "Baseline", "Calibrator"]

MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal data


@dataclass(frozen=True)
class Band:
    floor: float  # never pressure at or below this (the measure's unit)
    ceiling: float  # always pressure above this, learned or not

    def __post_init__(self) -> None:
        assert 0 <= self.floor <= self.ceiling, f"floor {self.floor} must be <= ceiling {self.ceiling}"


@dataclass(frozen=True)
class Baseline:
    """What one (measure, subject) looks like when calm, and the threshold that follows."""

    name: str
    subject: str
    samples: int  # calm values held (<= capacity)
    ready: bool  # samples >= min_samples: the threshold is learned, else it is the ceiling
    median: float
    mad: float
    threshold: float

    def record(self) -> dict[str, float | int | bool]:
        """The JSON shape in the registry record, /metrics labels aside."""
        return {
            "samples": self.samples,
            "ready": self.ready,
            "median": round(self.median, 3),
            "mad": round(self.mad, 3),
            "threshold": round(self.threshold, 3),
        }


class Calibrator:
    """Owned by the qos service loop; single-threaded. Only measures named in `bands` are learned."""

    def __init__(
        self,
        bands: Mapping[str, Band],
        ratio: float = 2.0,
        sigmas: float = 4.0,
        min_samples: int = 20,
        capacity: int = 240,
    ) -> None:
        assert ratio >= 1, "ratio must be >= 1: a threshold below the calm level would always fire"
        assert sigmas >= 0
        assert 1 <= min_samples <= capacity
        self.bands = dict(bands)
        self.ratio = ratio
        self.sigmas = sigmas
        self.min_samples = min_samples
        self.capacity = capacity
        self._calm: dict[tuple[str, str], deque[float]] = {}

    def threshold(self, name: str, subject: str) -> float:
        return self.baseline(name, subject).threshold

    def thresholds(self, measures: Iterable[Measure]) -> dict[tuple[str, str], float]:
        """(name, subject) -> threshold for every governed measure (others are informational)."""
        return {
            (m.name, m.subject): self.threshold(m.name, m.subject) for m in measures if m.name in self.bands
        }

    def learn(self, measures: Iterable[Measure]) -> None:
        """Take one calm tick's values (the caller decides calm)."""
        for m in measures:
            if m.name not in self.bands:
                continue
            key = (m.name, m.subject)
            ring = self._calm.get(key)
            if ring is None:
                ring = self._calm[key] = deque(maxlen=self.capacity)
            elif len(ring) >= self.min_samples and m.value > self.threshold(m.name, m.subject):
                continue  # pressure is not calm, whatever the SLO says
            ring.append(m.value)

    def retain(self, subjects: Iterable[str]) -> None:
        """Drop the baselines of subjects no longer observed (targets that left)."""
        keep = set(subjects)
        for key in [k for k in self._calm if k[1] not in keep]:
            del self._calm[key]

    def baseline(self, name: str, subject: str) -> Baseline:
        band = self.bands[name]
        ring = self._calm.get((name, subject), ())
        if len(ring) < self.min_samples:
            med = statistics.median(ring) if ring else 0.0
            return Baseline(name, subject, len(ring), False, med, 0.0, band.ceiling)
        med = statistics.median(ring)
        mad = statistics.median(abs(v - med) for v in ring)
        learned = max(self.ratio * med, med + self.sigmas * MAD_TO_SIGMA * mad)
        return Baseline(name, subject, len(ring), True, med, mad, min(band.ceiling, max(band.floor, learned)))

    def baselines(self) -> list[Baseline]:
        return [self.baseline(name, subject) for name, subject in sorted(self._calm)]
