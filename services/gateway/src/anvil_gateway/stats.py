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
counts the requests and batches it saw, and writes them into its registry entry at every heartbeat;
the stats routes add the other live gateways' entries (`peer_stats.py`), so with several gateways or
ANVIL_HTTP_WORKERS > 1 any of them answers with the totals (the others' shares up to one heartbeat
old). Only models and versions the gateway knows get an entry (an unknown name is a 404, never a
new series).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anvil_core.codec import pb

__all__ = ["ModelStats", "Stats", "add_peer"]

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
        """Triton's `/v2/models[/{m}[/versions/{v}]]/stats` answer for these (model, version)s,
        this process's share only (`peer_stats.stats_doc` adds the other gateways')."""
        return {"model_stats": [self.model_doc(name, version) for name, version in models]}

    def snapshot(self) -> list[dict[str, Any]]:
        """Every entry this process holds, for its registry entry (the other gateways add it)."""
        return [self.model_doc(name, version) for name, version in list(self.models)]


_TIMES = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_COMPUTE = ("compute_input", "compute_infer", "compute_output")


def _count_ns(raw: Any) -> tuple[int, int]:
    """A peer's {"count", "ns"}: two non-negative ints, else ValueError."""
    count, ns = raw["count"], raw["ns"]
    if not (type(count) is int and type(ns) is int and count >= 0 and ns >= 0):
        raise ValueError(f"not a count/ns pair: {raw!r}")
    return count, ns


def _add_pair(dst: dict[str, int], raw: Any) -> None:
    count, ns = _count_ns(raw)
    dst["count"] += count
    dst["ns"] += ns


def add_peer(doc: dict[str, Any], peer: Any) -> bool:
    """Add a peer gateway's entry (one element of its `snapshot`, read back from Redis) into `doc`,
    this process's entry for the same model and version. Nothing from a peer is trusted: a
    malformed entry changes nothing and returns False."""
    try:
        counts = [peer["inference_count"], peer["execution_count"], peer["last_inference"]]
        if not all(type(c) is int and c >= 0 for c in counts):
            return False
        stats = peer["inference_stats"]
        times = {k: _count_ns(stats[k]) for k in _TIMES}
        sizes: dict[int, dict[str, tuple[int, int]]] = {}
        for b in peer["batch_stats"][:MAX_BATCH_SIZES]:
            size = b["batch_size"]
            if not (type(size) is int and 0 < size <= 1 << 20):
                return False
            sizes[size] = {k: _count_ns(b[k]) for k in _COMPUTE}
    except (KeyError, TypeError, ValueError, IndexError):
        return False
    doc["inference_count"] += counts[0]
    doc["execution_count"] += counts[1]
    doc["last_inference"] = max(doc["last_inference"], counts[2])
    for k, (count, ns) in times.items():
        doc["inference_stats"][k] = {"count": doc["inference_stats"][k]["count"] + count,
                                     "ns": doc["inference_stats"][k]["ns"] + ns}  # fmt: skip
    mine = {b["batch_size"]: b for b in doc["batch_stats"]}
    for size, parts in sizes.items():
        entry = mine.get(size)
        if entry is None:
            if len(mine) >= MAX_BATCH_SIZES:
                continue
            entry = mine[size] = {"batch_size": size, **{k: {"count": 0, "ns": 0} for k in _COMPUTE}}
        for k, (count, ns) in parts.items():
            entry[k] = {"count": entry[k]["count"] + count, "ns": entry[k]["ns"] + ns}
    doc["batch_stats"] = [mine[size] for size in sorted(mine)]
    return True
