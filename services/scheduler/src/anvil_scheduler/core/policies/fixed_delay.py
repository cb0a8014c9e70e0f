"""Triton-style dynamic batcher: FIFO; a batch leaves when it is full or when the oldest request has
waited ``max_queue_delay_us``. Nothing is shed: late requests run late (Triton's default queue policy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from anvil_scheduler.core.edf import QueueOrder
from anvil_scheduler.core.policy import BatchingPolicy, QueueView

__all__ = ["FixedDelayConfig", "FixedDelayPolicy"]


@dataclass(frozen=True)
class FixedDelayConfig:
    max_batch: int = 32  # Triton's max_batch_size (capped by the model and executor limits)
    max_queue_delay_us: int = 1000  # Triton's max_queue_delay_microseconds

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue_delay_us < 0:
            raise ValueError(f"need max_batch >= 1 and max_queue_delay_us >= 0, got {self}")


class FixedDelayPolicy(BatchingPolicy):
    name: ClassVar[str] = "fixed_delay"
    order: ClassVar[QueueOrder] = QueueOrder.ARRIVAL
    sheds: ClassVar[bool] = False

    def __init__(self, config: FixedDelayConfig | None = None) -> None:
        super().__init__()
        self.config = config or FixedDelayConfig()

    def batch_limit(self, model: str) -> int:
        return min(self.config.max_batch, self.max_batch(model))

    def release_at(self, view: QueueView) -> float:
        if view.depth >= view.cap:
            return view.now_s
        return view.head.arrival_s + self.config.max_queue_delay_us / 1e6
