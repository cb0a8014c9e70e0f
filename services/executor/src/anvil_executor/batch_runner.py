"""Turns a wire Batch into model calls and a wire BatchResult. Runs on the compute thread: no sockets.

Input framing: per request, its InferRequest envelope then its payload frames (infer_codec).
Output framing: per answered request, its InferResponse envelope then its output payloads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.model_spec import SpecError
from anvil_core.tensors import HostTensor, TensorError
from anvil_core.wire import pb
from anvil_executor import metrics as m
from anvil_executor.device import is_device_fault
from anvil_executor.models import Model, RequestInputs

__all__ = ["ShmResolver", "run_batch"]

# Resolves a Tensor whose bytes live in shared memory (frame = -1) into a HostTensor view.
ShmResolver = Callable[[pb.Tensor], HostTensor]


def _no_shm(t: pb.Tensor) -> HostTensor:
    raise TensorError("shared-memory inputs are not enabled on this executor")


def _inputs(req: pb.InferRequest, payloads: Sequence[Any], shm: ShmResolver) -> list[HostTensor]:
    out = []
    for j in range(req.InputsLength()):
        t = req.Inputs(j)
        out.append(shm(t) if t.Frame() < 0 else codec.request_tensor(t, payloads))
    return out


def run_batch(
    models: dict[str, Model],
    batch: pb.BatchT,
    frames: list[Any],
    executor_id: str,
    device: str,
    shm: ShmResolver = _no_shm,
) -> tuple[pb.BatchResultT, list[Any]]:
    """Run every request of `batch`; returns the result header and its frames.

    A request whose tensors do not decode or fit the spec, or whose deadline has passed, gets its
    own error; the rest of the batch still runs. A model failure fails the whole batch.
    """
    t0 = time.perf_counter()
    result = pb.BatchResultT()
    result.batchId = batch.batchId
    result.executorId = executor_id
    result.device = device
    model_name = wire.text(batch.model)
    model = models.get(model_name)
    if model is None:
        result.error = wire.error(pb.ErrorCode.NOT_FOUND, f"model {model_name!r} is not loaded here")
        return result, []
    try:
        groups = list(codec.split_groups(frames, wire.ints(batch.frameCounts)))
        requests = [codec.open_request(g[0]) for g in groups]
    except wire.ProtocolError as exc:
        result.error = wire.error(pb.ErrorCode.PROTOCOL, f"malformed batch: {exc}")
        return result, []
    queue_us = wire.ints(batch.queueUs)

    answers: list[tuple[bytes, list[Any]] | None] = [None] * len(requests)
    runnable: list[tuple[int, RequestInputs]] = []
    now_ns = time.time_ns()
    for i, (req, group) in enumerate(zip(requests, groups, strict=True)):
        try:
            if req.DeadlineUnixNs() and req.DeadlineUnixNs() <= now_ns:
                answers[i] = (_error(req, pb.ErrorCode.DEADLINE, "deadline passed before execution"), [])
                continue
            tensors = _inputs(req, group[1:], shm)
            model.spec.validate(tensors)
            inputs = {t.name: t.data for t in tensors}
            model.check_request(inputs)
        except (TensorError, SpecError) as exc:
            answers[i] = (_error(req, pb.ErrorCode.BAD_REQUEST, str(exc)), [])
            continue
        runnable.append((i, inputs))

    if runnable:
        try:
            produced_all = model.run([inputs for _, inputs in runnable])
        except Exception as exc:  # a model bug must not kill the executor; every request hears it
            if is_device_fault(exc):
                raise  # the compute loop answers the batch, then the executor restarts clean
            result.error = wire.error(pb.ErrorCode.INTERNAL, f"model {model_name!r} failed: {exc}")
            return result, []
        compute_us = int((time.perf_counter() - t0) * 1e6)
        specs = {s.name: s for s in model.spec.outputs}
        for (i, _), produced in zip(runnable, produced_all, strict=True):
            req = requests[i]
            wanted = [(req.Outputs(k) or b"").decode() for k in range(req.OutputsLength())] or list(produced)
            missing = [n for n in wanted if n not in produced]
            if missing:
                answers[i] = (_error(req, pb.ErrorCode.BAD_REQUEST, f"model has no outputs {missing}"), [])
                continue
            payloads: list[Any] = []
            tensors = [HostTensor.from_array(n, specs[n].datatype, produced[n]) for n in wanted]
            env = codec.build_response(
                request_id=req.RequestId() or b"",
                trace_id=req.TraceId() or b"",
                model=req.Model() or b"",
                version=req.ModelVersion() or b"",
                outputs=codec.tensor_frames(tensors, payloads),
                queue_us=queue_us[i] if i < len(queue_us) else 0,
                compute_us=compute_us,
            )
            answers[i] = (env, payloads)

    out: list[Any] = []
    counts: list[int] = []
    for answer in answers:
        if answer is not None:
            out.append(answer[0])
            out.extend(answer[1])
            counts.append(1 + len(answer[1]))
    result.frameCounts = counts
    result.computeUs = int((time.perf_counter() - t0) * 1e6)
    for i, _ in runnable:  # the hop "compute", once per request that ran, by its priority
        m.hop_us.labels(hop="compute", priority=m.priority_label(requests[i].Priority())).observe(
            result.computeUs
        )
    return result, out


def _error(req: pb.InferRequest, code: int, reason: str) -> bytes:
    return codec.build_response(
        request_id=req.RequestId() or b"",
        trace_id=req.TraceId() or b"",
        model=req.Model() or b"",
        error=(code, reason),
    )
