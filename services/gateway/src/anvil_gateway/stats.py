"""Per-model inference statistics in Triton's `/v2/models/stats` shape (durations in ns)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelStats", "Stats"]


@dataclass
class _Counter:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    last_inference_ms: int = 0
    inference_count: int = 0  # rows (batch elements) answered
    execution_count: int = 0  # requests executed
    success: _Counter = field(default_factory=_Counter)
    fail: _Counter = field(default_factory=_Counter)
    queue: _Counter = field(default_factory=_Counter)
    compute_infer: _Counter = field(default_factory=_Counter)
    # The executor times a batch as one span (decode + run + encode): input/output are counted with
    # zero time so the three compute counts agree, as perf_analyzer requires.
    compute_input: _Counter = field(default_factory=_Counter)
    compute_output: _Counter = field(default_factory=_Counter)


class Stats:
    def __init__(self) -> None:
        self.models: dict[tuple[str, str], ModelStats] = {}

    def _get(self, model: str, version: str) -> ModelStats:
        stats = self.models.get((model, version))
        if stats is None:  # not setdefault: that would build a ModelStats on every request
            stats = self.models[(model, version)] = ModelStats()
        return stats

    def success(
        self, model: str, version: str, rows: int, total_ns: int, queue_ns: int, compute_ns: int
    ) -> None:
        s = self._get(model, version)
        s.last_inference_ms = int(time.time() * 1000)
        s.inference_count += rows
        s.execution_count += 1
        s.success.add(total_ns)
        s.queue.add(queue_ns)
        s.compute_infer.add(compute_ns)
        s.compute_input.add(0)
        s.compute_output.add(0)

    def failure(self, model: str, version: str, total_ns: int) -> None:
        self._get(model, version).fail.add(total_ns)

    def doc(self, models: list[tuple[str, str]]) -> dict[str, Any]:
        out = []
        for name, version in models:
            s = self.models.get((name, version), ModelStats())
            zero = {"count": 0, "ns": 0}
            out.append(
                {
                    "name": name,
                    "version": version,
                    "last_inference": s.last_inference_ms,
                    "inference_count": s.inference_count,
                    "execution_count": s.execution_count,
                    "inference_stats": {
                        "success": s.success.doc(),
                        "fail": s.fail.doc(),
                        "queue": s.queue.doc(),
                        "compute_input": s.compute_input.doc(),
                        "compute_infer": s.compute_infer.doc(),
                        "compute_output": s.compute_output.doc(),
                        "cache_hit": zero,
                        "cache_miss": zero,
                    },
                    "batch_stats": [],
                }
            )
        return {"model_stats": out}
