"""Open-loop arrival schedules: the intended send time of every request, fixed before the run.

Latency is measured from these intended times, so a server (or generator) that falls behind is
charged for the wait it caused (no coordinated omission).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PATTERNS", "Schedule", "schedule"]

PATTERNS = ("poisson", "constant", "step", "onoff", "trace")


@dataclass(frozen=True)
class Schedule:
    """Send offsets in seconds from the start of the run, ascending. `(n,) float64`; `priorities`,
    when the schedule carries them (a trace with a priority column), `(n,) int8` in 1..3, one per
    offset (they replace the workload's priority mix)."""

    offsets_s: np.ndarray
    pattern: str
    rate_rps: float
    duration_s: float
    priorities: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.offsets_s.shape[0])


def _poisson(rate: float, start: float, end: float, rng: np.random.Generator) -> np.ndarray:
    if rate <= 0 or end <= start:
        return np.empty(0)
    n = int((end - start) * rate * 1.2) + 16  # enough gaps to pass `end` with near certainty
    t = start + np.cumsum(rng.exponential(1.0 / rate, n))
    while t[-1] < end:
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, n))])
    return t[t < end]


def _constant(rate: float, start: float, end: float) -> np.ndarray:
    if rate <= 0 or end <= start:
        return np.empty(0)
    return start + np.arange(int(np.ceil((end - start) * rate))) / rate


def schedule(
    pattern: str,
    rate_rps: float,
    duration_s: float,
    *,
    seed: int = 0,
    burst_factor: float = 4.0,
    burst_at_s: float | None = None,
    burst_len_s: float | None = None,
    period_s: float = 2.0,
    trace: Path | None = None,
    trace_rate_rps: float | None = None,
) -> Schedule:
    """Arrival offsets for one run.

    poisson: exponential gaps at `rate_rps`. constant: evenly spaced. step: Poisson at `rate_rps`, with
    `burst_factor` x the rate from `burst_at_s` (default a third in) for `burst_len_s` (a third).
    onoff: Poisson at `rate_rps` for half of each `period_s`, silent for the other half.
    trace: one send offset in seconds per line of `trace` (sorted; lines after `duration_s` dropped),
    time-scaled so its mean rate is `trace_rate_rps` when that is given (the shape of the bursts kept);
    a line may give its request's priority after the offset (`_read_trace`), carried in `priorities`.
    """
    rng = np.random.default_rng(seed)
    if pattern == "poisson":
        t = _poisson(rate_rps, 0.0, duration_s, rng)
    elif pattern == "constant":
        t = _constant(rate_rps, 0.0, duration_s)
    elif pattern == "step":
        at = duration_s / 3 if burst_at_s is None else burst_at_s
        length = duration_s / 3 if burst_len_s is None else burst_len_s
        end = min(duration_s, at + length)
        t = np.concatenate(
            [
                _poisson(rate_rps, 0.0, at, rng),
                _poisson(rate_rps * burst_factor, at, end, rng),
                _poisson(rate_rps, end, duration_s, rng),
            ]
        )
    elif pattern == "onoff":
        parts = []
        for start in np.arange(0.0, duration_s, period_s):
            parts.append(_poisson(rate_rps, start, min(duration_s, start + period_s / 2), rng))
        t = np.concatenate(parts) if parts else np.empty(0)
    elif pattern == "trace":
        if trace is None:
            raise ValueError("pattern 'trace' needs a trace file (--trace): one send offset in s per line")
        t, prios = _read_trace(trace)
        if t.size and t[0] < 0:
            raise ValueError("trace offsets must be >= 0 s")
        if trace_rate_rps is not None:
            if trace_rate_rps <= 0:
                raise ValueError(f"a trace's rate must be > 0 req/s, got {trace_rate_rps:g}")
            span = float(t[-1] - t[0]) if t.size > 1 else 0.0
            if span <= 0:
                raise ValueError("a trace needs two or more distinct offsets to be rescaled to a rate")
            t = (t - t[0]) * ((t.size - 1) / span / trace_rate_rps)  # mean rate -> trace_rate_rps
            rate_rps = trace_rate_rps
        keep = t <= duration_s if duration_s > 0 else np.ones(t.shape, dtype=bool)
        t, prios = t[keep], None if prios is None else prios[keep]
        duration_s = float(t[-1]) if duration_s <= 0 and t.size else duration_s
        return Schedule(np.asarray(t, dtype=np.float64), pattern, rate_rps, duration_s, prios)
    else:
        raise ValueError(f"unknown arrival pattern {pattern!r}; one of {', '.join(PATTERNS)}")
    return Schedule(np.asarray(t, dtype=np.float64), pattern, rate_rps, duration_s)


def _read_trace(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """A trace file: one send offset in s per line, optionally followed by the request's priority
    (1, 2 or 3); `#` starts a comment. Returns the offsets sorted and, when every line gives one,
    the priorities in the same order (a file where only some lines do is refused)."""
    offsets: list[float] = []
    prios: list[int] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        cells = raw.split("#")[0].split()
        if not cells:
            continue
        if len(cells) > 2:
            raise ValueError(f"{path}:{number}: expected 'offset_s [priority]', got {raw.strip()!r}")
        try:
            offsets.append(float(cells[0]))
            if len(cells) == 2:
                prios.append(int(cells[1]))
        except ValueError:
            raise ValueError(
                f"{path}:{number}: expected 'offset_s [priority]', got {raw.strip()!r}"
            ) from None
        if len(cells) == 2 and prios[-1] not in (1, 2, 3):
            raise ValueError(f"{path}:{number}: priority must be 1, 2 or 3, got {cells[1]}")
    if prios and len(prios) != len(offsets):
        raise ValueError(f"{path}: {len(prios)} of {len(offsets)} lines give a priority; give all or none")
    t = np.array(offsets, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    return t[order], (np.array(prios, dtype=np.int8)[order] if prios else None)
