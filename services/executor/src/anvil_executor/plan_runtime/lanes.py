"""Lanes: several copies of one compiled plan in one executor, each run by its own compute thread.

A plan instance owns mutable state for the batch it runs: its activation arena, its pinned bank, on a
GPU its CUDA stream and the graphs captured on that stream. Two threads must never run one instance
at once. With ``ANVIL_LANES=N`` the executor starts N compute threads; thread ``i`` runs lane ``i``
(``use_lane``), and a ``LanedPlan`` holds N instances of a plan and sends each call to the calling
thread's lane. On a GPU the lanes are N streams in one CUDA context, so their kernels overlap on the
device; N executor processes sharing a GPU instead time-slice it between N contexts
(bench/results/profile_minilm_gpu_c16_s7.json: 48.5% of an executor's samples waited in the
synchronize after its graph launch).

Each lane holds its own copy of the weights (the instances are independent loads of the artifact):
N lanes of all-MiniLM-L6-v2 fp16 cost N x 45 MB of device memory, as N processes did, without N
CUDA contexts. The lane of a thread that never called ``use_lane`` (the I/O loop's inline batches,
loader threads) is 0; the executor runs a batch inline only when no compute thread is busy.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from anvil_executor.models.base import RequestInputs, RequestOutputs
from anvil_executor.plan_runtime.io import PlanIO

__all__ = ["LanedPlan", "current_lane", "set_lane", "use_lane"]

_local = threading.local()


def set_lane(index: int) -> None:
    """The calling thread runs lane ``index`` of every laned plan from now on (a compute thread)."""
    if index < 0:
        raise ValueError(f"lane must be >= 0, got {index}")
    _local.lane = index


def current_lane() -> int:
    return int(getattr(_local, "lane", 0))


@contextlib.contextmanager
def use_lane(index: int) -> Iterator[None]:
    """Run the block on lane ``index`` (warm-up of every lane), then the thread's lane again."""
    before = current_lane()
    set_lane(index)
    try:
        yield
    finally:
        set_lane(before)


class _Usage:
    """``arena.usage()`` of a laned plan: each bank's bytes summed over the lanes."""

    def __init__(self, lanes: Sequence[Any]) -> None:
        self._lanes = lanes

    def usage(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lane in self._lanes:
            for bank, size in lane.arena.usage().items():
                out[bank] = out.get(bank, 0) + int(size)
        return out


class _LanedRunner:
    """A CPU plan's packed runner (plan_runtime/packed.py) on the calling thread's lane."""

    def __init__(self, plan: LanedPlan) -> None:
        self._plan = plan

    def run(self, ids: np.ndarray, cu: np.ndarray) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = self._plan.lane().packed.run(ids, cu)  # type: ignore[attr-defined]
        return out


class LanedPlan(PlanIO):
    """N instances of one plan served as one model; a call runs on the calling thread's lane."""

    def __init__(self, lanes: Sequence[PlanIO]) -> None:
        if not lanes:
            raise ValueError("a laned plan needs at least one lane")
        first = lanes[0]
        self.lanes = list(lanes)
        self.platform = first.platform
        self.plan = first.plan
        self.max_batch, self.max_seq = first.max_batch, first.max_seq
        self.inputs, self.outputs = first.inputs, first.outputs
        self.seq_inputs, self.mask_inputs = first.seq_inputs, first.mask_inputs
        self.spec = first.spec
        self.arena = _Usage(self.lanes)

    def lane(self) -> PlanIO:
        """The calling thread's lane (a thread past the last lane wraps around: never two threads
        on one lane as long as there are as many lanes as compute threads)."""
        return self.lanes[current_lane() % len(self.lanes)]

    def check_request(self, inputs: RequestInputs) -> None:
        self.lanes[0].check_request(inputs)  # the lanes are one plan: lane 0's checks (e.g. fp16 range)

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        return self.lane().run(batch)

    def _run_chunk(self, reqs: list[RequestInputs], lens: list[int], t: int) -> dict[str, np.ndarray]:
        return self.lane()._run_chunk(reqs, lens, t)

    def __getattr__(self, name: str) -> Any:
        """What the lanes share, read-only (precision, buckets, linear_report, graph_error, ...): lane
        0's. Anything a run changes is a lane's own and is reached through `lane()`."""
        if name == "lanes":  # not set yet: never look it up through itself
            raise AttributeError(name)
        return getattr(self.lanes[0], name)

    @property
    def packed(self) -> _LanedRunner | None:
        """The packed runner of the calling thread's lane (None where the plan runs padded)."""
        return _LanedRunner(self) if getattr(self.lanes[0], "packed", None) is not None else None

    @property
    def graph_count(self) -> int:
        return sum(int(getattr(lane, "graph_count", 0)) for lane in self.lanes)

    def reset_padding(self) -> None:
        for lane in self.lanes:
            reset = getattr(lane, "reset_padding", None)
            if reset is not None:
                reset()

    @property
    def runs(self) -> int:
        return sum(int(getattr(lane, "runs", 0)) for lane in self.lanes)

    @property
    def phase_ns(self) -> list[int]:
        """The lanes' phase times added up (gpu_model.PHASES)."""
        per_lane = [list(getattr(lane, "phase_ns", ())) for lane in self.lanes]
        return [sum(col) for col in zip(*per_lane, strict=True)] if all(per_lane) else []

    @property
    def padding_waste(self) -> float:
        padded = sum(int(getattr(lane, "padded_cells", 0)) for lane in self.lanes)
        used = sum(int(getattr(lane, "used_cells", 0)) for lane in self.lanes)
        return 1.0 - used / padded if padded else 0.0
