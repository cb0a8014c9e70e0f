"""Warm-up before READY (Triton's model warmup): a loaded model runs once per batch-size bucket it
can be sent before the executor advertises it, so the first real request does not pay for JIT
compilation, first-touch page faults or workspace growth.

Who calls: the executor, on the thread that loaded the model (start-up for built-ins, the loader
thread for a deployed artifact), before the model joins ``Executor.models``. Only that dict is
advertised (the registry record's ``models``, the ``READY`` status of ``anvil:model:{name}``, the
Register message to the scheduler), so a model is never visible before its warm-up ended.

What runs: every batch size the scheduler can send, ``1 .. min(executor max_batch, model
max_batch)`` (the scheduler caps a batch by both, `dispatch.place`), every size up to
``ALL_SIZES_UP_TO`` and powers of two above it, plus the maximum. One size per kernel path is what
matters (numba compiles per type signature, not per shape; anvil_kernels switches GEMM paths at
M = 1, 16 and 48 rows), the cheap small sizes are all run so no path is missed. A model with a
sequence axis (a -1 dim, or text: a BYTES input) runs those sizes at ``SHORT_SEQ`` tokens (text:
one short sentence), then once at its longest sequence (``max_seq`` of a plan, ``max_tokens`` of
a text model: a sentence repeated past it, truncated by the tokenizer) with as many requests as
fit ``LONG_RUN_TOKENS`` (at most the largest batch), which grows scratch buffers without paying
for a full largest batch of longest rows (64 x 256 tokens of MiniLM: ~10 s on 2 cores).

The runs are not batches: they produce no BatchResult, so neither the scheduler's latency profile
(fed by BatchResult.computeUs) nor the executor's compute histogram ever sees them; warm-up cannot
poison the predictions. Their total time is logged and exported as
``anvil_executor_warmup_seconds{model}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from anvil_core.logs import get_logger
from anvil_core.model_spec import ModelSpec
from anvil_core.tensors import numpy_dtype
from anvil_executor import metrics as m
from anvil_executor.models.base import Model, RequestInputs

__all__ = [
    "ALL_SIZES_UP_TO",
    "LONG_RUN_TOKENS",
    "SHORT_SEQ",
    "WarmupReport",
    "batch_sizes",
    "sample_request",
    "warm_up",
]

log = get_logger("anvil.executor.warmup")

ALL_SIZES_UP_TO = 16  # every batch size up to here is run (the GEMM paths switch at 1 and 16 rows)
SHORT_SEQ = 8  # tokens per row of the batch-size runs of a sequence model
LONG_RUN_TOKENS = 2048  # tokens of the longest-sequence run (a MiniLM plan's 8 x 128 fit whole)
WARM_TEXT = b"the executor warms this model up before it serves"  # BYTES inputs (text models)


@dataclass(frozen=True, slots=True)
class WarmupReport:
    model: str
    seconds: float  # wall time of all runs
    batch_sizes: tuple[int, ...]  # sizes run (requests per batch, one row each)
    runs: int
    first_run_s: float  # the cold run: what the first request would have paid
    slowest_rest_s: float  # the slowest of the other runs


def batch_sizes(max_batch: int) -> list[int]:
    """1 .. ALL_SIZES_UP_TO, then powers of two, then ``max_batch``; all <= max_batch."""
    top = max(1, max_batch)
    sizes = list(range(1, min(top, ALL_SIZES_UP_TO) + 1))
    p = ALL_SIZES_UP_TO * 2
    while p < top:
        sizes.append(p)
        p *= 2
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def _has_seq(spec: ModelSpec) -> bool:
    return any(d < 0 or t.datatype == "BYTES" for t in spec.inputs for d in (*t.dims, 0))


def _longest_seq(model: Model) -> int:
    """A plan's ``max_seq`` (PlanModel, GpuPlanModel), a text model's largest length bucket
    (TextEmbeddingModel); 0 for models without a longest sequence."""
    seq = getattr(model, "max_seq", 0)
    if not seq and getattr(model, "buckets", None):
        seq = max(model.buckets)  # type: ignore[attr-defined]
    return int(seq or 0)


def sample_request(spec: ModelSpec, seq: int = SHORT_SEQ) -> RequestInputs:
    """One request of one row that fits ``spec``: -1 dims are ``seq``; floats 0.5, integers 1
    (a valid token id, a valid mask), BYTES a sentence of >= ``seq`` words (one at SHORT_SEQ)."""
    req: RequestInputs = {}
    for t in spec.inputs:
        shape = (1, *(seq if d < 0 else d for d in t.dims))
        dt = numpy_dtype(t.datatype)
        if dt is None:
            req[t.name] = np.full(shape, b" ".join([WARM_TEXT] * max(1, seq // SHORT_SEQ)), dtype=object)
        elif dt.kind == "f":
            req[t.name] = np.full(shape, 0.5, dtype=dt)
        else:
            req[t.name] = np.ones(shape, dtype=dt)
    return req


def warm_up(model: Model, executor_max_batch: int) -> WarmupReport:
    """Run ``model`` once per batch-size bucket (module docstring); returns the timings, logs
    them and sets the metric. A model that fails here fails its load (it would fail requests)."""
    spec = model.spec
    top = max(1, min(executor_max_batch, spec.max_batch or 1))
    sizes = batch_sizes(top)
    seq_model = _has_seq(spec)
    short = SHORT_SEQ if seq_model else 1
    plan: list[tuple[int, int]] = [(n, short) for n in sizes]
    max_seq = _longest_seq(model)
    if seq_model and max_seq > short:
        plan.append((max(1, min(top, LONG_RUN_TOKENS // max_seq)), max_seq))
    times: list[float] = []
    t0 = time.perf_counter()
    for n, seq in plan:
        one = sample_request(spec, seq)
        t = time.perf_counter()
        model.run([one] * n)
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    report = WarmupReport(spec.name, total, tuple(sizes), len(plan), times[0], max(times[1:], default=0.0))
    m.warmup_seconds.labels(model=spec.name).set(total)
    log.info(
        "model warmed up",
        extra={
            "model": spec.name,
            "warmup_s": round(total, 4),
            "runs": report.runs,
            "batch_sizes": list(sizes),
            "first_run_ms": round(report.first_run_s * 1e3, 2),
            "slowest_other_run_ms": round(report.slowest_rest_s * 1e3, 2),
        },
    )
    return report
