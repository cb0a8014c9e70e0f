"""How busy the host's CPUs are, from /proc/stat: the signal of the CPU batching window.

On one host (`anvil up`, compose on one machine) the gateway, the scheduler, the executors and often
the load's client share the cores. When they run out, every batch costs CPU that the next request
needs: EDF+PID's work-conserving release (a batch leaves as soon as an executor is idle) then forms
many small batches, and each costs the three services their per-batch work (docs/scheduler.md,
"CPU batching window"). The scheduler reads the host's busy fraction here and widens a batching
window with it (core/config.py: ``cpu_window_us``).

``/proc/stat``'s first line sums every CPU's jiffies by state; busy = everything but idle and iowait.
The fraction is smoothed over samples (an exponential average), so one busy tick does not open the
window and one quiet tick does not close it. Where /proc/stat cannot be read (not Linux, a sandbox
without /proc) the reader says so once and reports 0: the window stays shut, as with the setting off.
Containers see the host's /proc/stat (it is not namespaced), which is what the window wants: the
cores the stack shares. On several hosts it sees the scheduler's own host only (docs say so).
"""

from __future__ import annotations

from pathlib import Path

from anvil_core.logs import get_logger

__all__ = ["HostCpu", "parse_proc_stat"]

log = get_logger("anvil.scheduler.host_cpu")
PROC_STAT = Path("/proc/stat")
_IDLE_FIELDS = (3, 4)  # idle, iowait (0-based among the numbers after "cpu")
# guest and guest_nice (fields 8, 9) are already counted in user and nice: summing them would count twice
_COUNTED_FIELDS = 8


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from /proc/stat's aggregate ``cpu`` line; ValueError if it has none."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = line.split()[1:]
            if len(fields) < 4:
                raise ValueError(f"/proc/stat cpu line has {len(fields)} fields, need >= 4")
            numbers = [int(f) for f in fields[:_COUNTED_FIELDS]]
            total = sum(numbers)
            idle = sum(numbers[i] for i in _IDLE_FIELDS if i < len(numbers))
            return total - idle, total
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


class HostCpu:
    """Smoothed busy fraction (0..1) of the host's CPUs between calls of ``sample``.

    ``alpha``: the weight of the newest interval in the exponential average (0.3 at the scheduler's
    50 ms chores: ~0.15 s to follow a step). ``path``: /proc/stat, replaceable in tests.
    """

    def __init__(self, alpha: float = 0.3, path: Path = PROC_STAT) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.path = path
        self.busy = 0.0
        self._last: tuple[int, int] | None = None
        self._broken = False

    def sample(self) -> float:
        """Read the counters; returns the smoothed busy fraction (0.0 until two readings exist)."""
        if self._broken:
            return 0.0
        try:
            now = parse_proc_stat(self.path.read_text())
        except (OSError, ValueError) as exc:
            self._broken = True
            self.busy = 0.0
            log.warning(
                "host CPU not readable: the CPU batching window stays shut",
                extra={"path": str(self.path), "err": str(exc)},
            )
            return 0.0
        last, self._last = self._last, now
        if last is None:
            return self.busy
        d_busy, d_total = now[0] - last[0], now[1] - last[1]
        if d_total <= 0:  # no tick elapsed (or a counter went back): nothing new to average
            return self.busy
        fraction = min(1.0, max(0.0, d_busy / d_total))
        self.busy += self.alpha * (fraction - self.busy)
        return self.busy
