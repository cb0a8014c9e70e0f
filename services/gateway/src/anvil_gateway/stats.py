"""Per-model inference statistics in Triton's `/v2/models/stats` shape (durations in ns).

What each number means (Triton's definitions; docs/observability.md):

* ``inference_count``: inferences answered with success: a request of N rows (its batch dimension)
  counts N, a request to a model without a batch dimension 1.
* ``execution_count``: batches the executors ran for the model; ``batch_stats``: one entry per
  batch size (rows in the batch), with the batch's copy-in, model run and copy-out times.
* ``inference_stats``: per request. ``success``/``fail``: count and end-to-end time at the gateway.
  ``queue``: the scheduler's queue plus the wait in the executor's batch queue. ``compute_input`` /
  ``compute_infer`` / ``compute_output``: the executor's measurements of the batch the request ran
  in (each request of a batch counts the batch's times, as in Triton).

A batch's requests come back as separate answers, possibly to several gateways: every answer
carries the batch's measurements and its place in the batch (InferResponse.batch_size ...), and
only the answer with index 0 counts the batch (``executed``, fed by the scheduler link for every
answer, also late ones). Each batch is thus counted once across all gateways; each gateway process
reports the share of the requests and batches it saw (with ANVIL_HTTP_WORKERS > 1 or several
gateways, summing their answers gives the totals). Only models and versions the gateway knows get
an entry (an unknown name is a 404, never a new series).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anvil_core.codec import pb

__all__ = ["ModelStats", "Stats"]

MAX_BATCH_SIZES = 4096  # batch_stats entries per model: sizes are rows, at most a model's max_batch


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
class _Compute:
    """compute_input / compute_infer / compute_output of a set of executions."""

    input: _Counter = field(default_factory=_Counter)
    infer: _Counter = field(default_factory=_Counter)
    output: _Counter = field(default_factory=_Counter)

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input.add(input_ns)
        self.infer.add(infer_ns)
        self.output.add(output_ns)


@dataclass
class ModelStats:
    last_inference_ms: int = 0
    inference_count: int = 0  # rows (batch elements) answered with success
    execution_count: int = 0  # batches executed
    success: _Counter = field(default_factory=_Counter)
    fail: _Counter = field(default_factory=_Counter)
    queue: _Counter = field(default_factory=_Counter)
    compute: _Compute = field(default_factory=_Compute)  # per request: its batch's times
    batches: dict[int, _Compute] = field(default_factory=dict)  # batch size (rows) -> executions


def _known_any(model: str, version: str) -> bool:
    return True


class Stats:
    """Owned by one gateway process; fed by the request paths (`success`, `failure`) and the
    scheduler link (`executed`), read by the stats routes (`doc`, `model_doc`)."""

    def __init__(self, known: Callable[[str, str], bool] = _known_any) -> None:
        self.models: dict[tuple[str, str], ModelStats] = {}
        self.known = known  # (model, version) served now: answers of others are not counted

    def _get(self, model: str, version: str) -> ModelStats:
        stats = self.models.get((model, version))
        if stats is None:  # not setdefault: that would build a ModelStats on every request
            stats = self.models[(model, version)] = ModelStats()
        return stats

    def success(self, model: str, version: str, rows: int, total_ns: int, resp: pb.InferResponseT) -> None:
        """A request of `rows` inferences answered with success after `total_ns` at the gateway."""
        s = self._get(model, version)
        s.last_inference_ms = int(time.time() * 1000)
        s.inference_count += rows
        s.success.add(total_ns)
        s.queue.add((resp.queueUs + resp.execQueueUs) * 1000)
        if resp.batchSize:
            s.compute.add(resp.computeInputUs * 1000, resp.computeInferUs * 1000, resp.computeOutputUs * 1000)
        else:  # an executor that does not split its time: all of it is the run
            s.compute.add(0, resp.computeUs * 1000, 0)

    def failure(self, model: str, version: str, total_ns: int) -> None:
        self._get(model, version).fail.add(total_ns)

    def executed(self, resp: pb.InferResponseT) -> None:
        """An answer from the scheduler (any outcome for its caller): the one with batch index 0
        counts its batch; the others and answers without batch measurements count nothing."""
        if not resp.batchSize or resp.batchIndex != 0:
            return
        model, version = resp.model or "", resp.modelVersion or ""
        if not self.known(model, version):
            return
        s = self._get(model, version)
        s.execution_count += 1
        batch = s.batches.get(resp.batchSize)
        if batch is None:
            if len(s.batches) >= MAX_BATCH_SIZES:
                return
            batch = s.batches[resp.batchSize] = _Compute()
        batch.add(resp.computeInputUs * 1000, resp.computeInferUs * 1000, resp.computeOutputUs * 1000)

    def model_doc(self, name: str, version: str) -> dict[str, Any]:
        """One model version's entry of Triton's `model_stats` list (zeros before any request)."""
        s = self.models.get((name, version)) or ModelStats()
        zero = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": s.success.doc(),
                "fail": s.fail.doc(),
                "queue": s.queue.doc(),
                "compute_input": s.compute.input.doc(),
                "compute_infer": s.compute.infer.doc(),
                "compute_output": s.compute.output.doc(),
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.input.doc(),
                    "compute_infer": b.infer.doc(),
                    "compute_output": b.output.doc(),
                }
                for size, b in sorted(s.batches.items())
            ],
        }

    def doc(self, models: list[tuple[str, str]]) -> dict[str, Any]:
        """Triton's `/v2/models[/{m}[/versions/{v}]]/stats` answer for these (model, version)s."""
        return {"model_stats": [self.model_doc(name, version) for name, version in models]}
