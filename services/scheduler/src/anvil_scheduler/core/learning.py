"""What the latency profiles learn from, so that a prediction that sheds keeps learning (issue #22).

* **Warm-up is not a sample.** The first completed batch of each (executor, model, batch size) is left
  out: a new process compiles, touches its weights and buffers for the first time, and that time says
  nothing about the next batch. An executor that is lost and comes back warms up again.
* **Probes.** A request the profile calls hopeless still runs when it is alone on an idle executor,
  once per ``probe_interval_s`` per (model, priority): its measurement is what lets a wrong prediction
  recover, so no model and priority can starve on a stale profile.

Ageing of old observations is the profile's own (``profile.py``).
"""

from __future__ import annotations

import math

__all__ = ["Learning"]


class Learning:
    """Warm-up and probe bookkeeping of one ``SchedulerCore``; single-threaded."""

    def __init__(self, probe_interval_s: float) -> None:
        self.probe_interval_s = probe_interval_s
        self._warm: set[tuple[str, str, int]] = set()  # (executor, model, batch size) that ran once
        self._last_probe_s: dict[tuple[str, int], float] = {}  # (model, priority) -> last probe

    def is_sample(self, executor_id: str, model: str, batch_size: int) -> bool:
        """Whether a completed batch is a sample of steady-state latency (False the first time)."""
        key = (executor_id, model, batch_size)
        if key in self._warm:
            return True
        self._warm.add(key)
        return False

    def forget_executor(self, executor_id: str) -> None:
        """The executor is gone: a process that registers under its id warms up again."""
        self._warm = {k for k in self._warm if k[0] != executor_id}

    def forget_model(self, model: str) -> None:
        """The model was undeployed: its next incarnation warms up and probes afresh."""
        self._warm = {k for k in self._warm if k[1] != model}
        self._last_probe_s = {k: t for k, t in self._last_probe_s.items() if k[0] != model}

    def probe_due(self, model: str, priority: int, now_s: float) -> bool:
        """True (and the interval restarts) if no probe of (model, priority) ran within the interval."""
        key = (model, priority)
        if now_s - self._last_probe_s.get(key, -math.inf) < self.probe_interval_s:
            return False
        self._last_probe_s[key] = now_s
        return True
