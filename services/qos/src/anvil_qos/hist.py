"""Log2 histograms of microseconds, as the eBPF probes fill them.

Bucket (slot) 0 holds values in [0, 1) µs; slot s >= 1 holds [2^(s-1), 2^s) µs. The BPF side computes
`slot = us ? bpf_log2l(us) : 0` (bcc's bpf_log2l(v) = floor(log2 v) + 1), so the two agree exactly.
Histograms are cumulative since the probe attached; `delta` gives one interval's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Log2Histogram", "slot_bounds_us", "slot_of_us"]


def slot_of_us(us: float) -> int:
    """The slot the BPF side puts `us` in (for tests and the /proc twin)."""
    return 0 if us < 1 else int(us).bit_length()


def slot_bounds_us(slot: int) -> tuple[float, float]:
    """[low, high) of one slot, in µs."""
    if slot <= 0:
        return 0.0, 1.0
    return float(1 << (slot - 1)), float(1 << slot)


@dataclass(frozen=True)
class Log2Histogram:
    counts: Mapping[int, int] = field(default_factory=dict)  # slot -> events

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def delta(self, earlier: Log2Histogram) -> Log2Histogram:
        """Events since `earlier` (a previous reading of the same cumulative histogram)."""
        out = {s: c - earlier.counts.get(s, 0) for s, c in self.counts.items()}
        return Log2Histogram({s: c for s, c in out.items() if c > 0})

    def percentile_us(self, q: float) -> float:
        """The q-quantile (0 < q <= 1), interpolated linearly inside its bucket; 0 when empty.

        Log2 buckets bound the error to the bucket's width: the true value lies in [low, high)."""
        assert 0 < q <= 1, q
        total = self.total
        if total == 0:
            return 0.0
        rank = q * total
        seen = 0
        for slot in sorted(self.counts):
            count = self.counts[slot]
            if seen + count >= rank:
                low, high = slot_bounds_us(slot)
                return low + (high - low) * (rank - seen) / count
            seen += count
        return slot_bounds_us(max(self.counts))[1]

    def sum_bounds_us(self) -> tuple[float, float]:
        """The smallest and largest total the bucketed events can add up to, in µs."""
        low = sum(slot_bounds_us(s)[0] * c for s, c in self.counts.items())
        high = sum(slot_bounds_us(s)[1] * c for s, c in self.counts.items())
        return low, high
