"""Clipper-style AIMD batching: FIFO, work-conserving (a batch of min(queue, cap) leaves whenever an
executor would idle); the cap grows by ``additive_step`` after every batch whose execution time stayed
within the objective and shrinks by ``backoff`` after one that did not. As in Clipper, the objective is
compared with the batch's *processing* latency; here it is ``slo_fraction`` x the tightest budget in the
batch. Nothing is shed: late requests run late."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from anvil_scheduler.core.edf import QueueOrder
from anvil_scheduler.core.policy import BatchingPolicy, QueueView
from anvil_scheduler.core.request import Batch

__all__ = ["AimdConfig", "AimdPolicy"]


@dataclass(frozen=True)
class AimdConfig:
    initial_batch: int = 1
    additive_step: int = 1  # Clipper grows by a fixed amount per batch under the objective
    backoff: float = 0.1  # Clipper backs off by 10% on a miss
    slo_fraction: float = 1.0  # objective = this x the tightest request budget in the batch

    def __post_init__(self) -> None:
        if self.initial_batch < 1 or self.additive_step < 1:
            raise ValueError(f"need initial_batch >= 1 and additive_step >= 1, got {self}")
        if not 0 < self.backoff < 1 or self.slo_fraction <= 0:
            raise ValueError(f"need 0 < backoff < 1 and slo_fraction > 0, got {self}")


class AimdPolicy(BatchingPolicy):
    name: ClassVar[str] = "aimd"
    order: ClassVar[QueueOrder] = QueueOrder.ARRIVAL
    sheds: ClassVar[bool] = False

    def __init__(self, config: AimdConfig | None = None) -> None:
        super().__init__()
        self.config = config or AimdConfig()
        self._cap: dict[str, int] = {}

    def bind(self, model: str, max_batch: int, predict_s: Callable[[int], float]) -> None:
        super().bind(model, max_batch, predict_s)
        self._cap[model] = min(self._cap.get(model, self.config.initial_batch), max_batch)

    def forget(self, model: str) -> None:
        super().forget(model)
        self._cap.pop(model, None)

    def batch_limit(self, model: str) -> int:
        return self._cap[model]

    def release_at(self, view: QueueView) -> float:
        return view.now_s if view.executor_idle else math.inf

    def observe(self, batch: Batch, exec_s: float, now_s: float) -> None:
        objective_s = self.config.slo_fraction * min(r.budget_s for r in batch.requests)
        cap = self._cap[batch.model]
        if exec_s <= objective_s:
            cap += self.config.additive_step
        else:
            cap = math.floor(cap * (1.0 - self.config.backoff))
        self._cap[batch.model] = max(1, min(cap, self.max_batch(batch.model)))
