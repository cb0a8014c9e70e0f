"""Turns a wire Batch into model calls and a wire BatchResult. Runs on the compute thread: no sockets.

Input framing: per request, its InferRequest envelope then its payload frames (codec.messages).
Every request envelope is verified by the wire codec before a field is used.
Output framing: per answered request, its InferResponse envelope then its output payloads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from anvil_core import codec, tracing
from anvil_core.codec import pb
from anvil_core.model_spec import SpecError
from anvil_core.tensors import HostTensor, TensorError
from anvil_executor import batch_spans
from anvil_executor import metrics as m
from anvil_executor.device import is_device_fault
from anvil_executor.models import Model, RequestInputs

__all__ = ["Pending", "ShmResolver", "account_batch", "finish_batch", "prepare_batch", "run_batch"]

# Resolves a Tensor whose bytes live in shared memory (frame = -1) into a HostTensor view.
ShmResolver = Callable[[pb.TensorT], HostTensor]


_UNPREPARED: Any = object()  # Pending.prepared before (or without) the model's prepare


def _no_shm(t: pb.TensorT) -> HostTensor:
    raise TensorError("shared-memory inputs are not enabled on this executor")


def _inputs(req: pb.InferRequestT, payloads: Sequence[Any], shm: ShmResolver) -> list[HostTensor]:
    try:
        codec.check_payloads(req.inputs, payloads, "input")
    except codec.ProtocolError as exc:
        raise TensorError(str(exc)) from None
    return [shm(t) if t.frame < 0 else codec.request_tensor(t, payloads) for t in req.inputs or ()]


@dataclass(slots=True)
class Pending:
    """A batch decoded and verified (and, for a model that `prepares`, prepared), waiting for the
    compute thread. It keeps the received frames alive: its inputs are views of them."""

    result: pb.BatchResultT
    model: Model | None
    requests: list[Any] = field(default_factory=list)
    answers: list[tuple[bytes, list[Any]] | None] = field(default_factory=list)
    runnable: list[tuple[int, RequestInputs]] = field(default_factory=list)
    queue_us: list[int] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)
    prepared: Any = _UNPREPARED
    busy_s: float = 0.0  # host time spent on it so far (decode, prepare), not waits between threads
    priority: int = 0  # the most urgent priority among its runnable requests (0: none)
    rows: list[int] = field(default_factory=list)  # inferences per runnable request (statistics)
    copy_in_ns: tuple[int, int] = (0, 0)  # perf_counter_ns: decode/check/prepare started, ended
    queued_us: int = 0  # received by the executor -> its preparation started
    traceparent: str = ""  # the scheduler's batch span (Batch.traceparent), for the executor's spans
    dispatched_unix_ns: int = 0  # per-hop timing: the scheduler's dispatch stamp (Batch.sent_unix_ns)
    received_unix_ns: int = 0  # and the executor's receipt, wall clock ns (echoed in every answer)
    reply_to: list[str] = field(default_factory=list)  # per request: its gateway (direct answers), or ""
    # each answer's request index and frames ([envelope, *payloads]), in the BatchResult's order
    answer_groups: list[tuple[int, list[Any]]] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)  # finish_batch's perf ns (spans), for account_batch


def run_batch(
    models: dict[str, Model],
    batch: pb.BatchT,
    frames: list[Any],
    executor_id: str,
    device: str,
    shm: ShmResolver = _no_shm,
    queued_us: int = 0,
) -> tuple[pb.BatchResultT, list[Any]]:
    """Run every request of `batch`; returns the result header and its frames.

    A request whose tensors do not decode or fit the spec, or whose deadline has passed, gets its
    own error; the rest of the batch still runs. A model failure fails the whole batch.
    Every answer with outputs carries the batch's measurements (codec.BatchTiming: copy-in, run,
    copy-out, `queued_us` waited in the executor before it started) and its place in the batch; a
    traced batch also gets its spans (batch_spans.py).
    """
    pending = prepare_batch(models, batch, frames, executor_id, device, shm, queued_us=queued_us)
    result, out = finish_batch(pending)
    account_batch(pending, result)
    return result, out


def prepare_batch(
    models: dict[str, Model],
    batch: pb.BatchT,
    frames: list[Any],
    executor_id: str,
    device: str,
    shm: ShmResolver = _no_shm,
    prepare: bool = False,
    queued_us: int = 0,
    received_unix_ns: int = 0,
) -> Pending:
    """Decode and verify every request of `batch` (its own error for each that fails); with
    `prepare`, also run the model's host-side `prepare` on the runnable ones (the prep thread).
    This is the batch's copy-in (statistics and spans). `received_unix_ns`: when the executor read
    the batch (wall clock; 0: now), echoed in every answer for the per-hop timing."""
    t0 = time.perf_counter()
    t0_ns = time.perf_counter_ns()
    result = pb.BatchResultT(batchId=batch.batchId, executorId=executor_id, device=device)
    model_name = batch.model or ""
    model = models.get(model_name)
    if model is None:
        result.error = codec.error(pb.ErrorCode.NOT_FOUND, f"model {model_name!r} is not loaded here")
        return Pending(result, None)
    try:
        groups = list(codec.split_groups(frames, batch.frameCounts or ()))
    except codec.ProtocolError as exc:
        result.error = codec.error(pb.ErrorCode.PROTOCOL, f"malformed batch: {exc}")
        return Pending(result, None)
    pending = Pending(result, model, queue_us=list(batch.queueUs or ()), frames=frames, queued_us=queued_us)
    pending.traceparent = batch.traceparent or ""
    pending.dispatched_unix_ns = int(batch.sentUnixNs or 0)
    pending.received_unix_ns = received_unix_ns or time.time_ns()
    reply_to = list(batch.replyTo or ())
    if len(reply_to) == len(groups):  # else (a scheduler's bug) every answer goes through it
        pending.reply_to = [
            g.decode(errors="replace") if isinstance(g, bytes) else (g or "") for g in reply_to
        ]
    answers: list[tuple[bytes, list[Any]] | None] = [None] * len(groups)
    requests: list[Any] = []
    for i, group in enumerate(groups):
        try:
            requests.append(codec.read_request(group[0]))
        except codec.ProtocolError as exc:  # its own error when its id reads; the rest still runs
            requests.append(None)
            ids = codec.peek_request_ids(group[0])
            if ids is not None:
                reason = f"refused: {exc}"
                answers[i] = (codec.build_response(request_id=ids[0], trace_id=ids[1], model="",
                                                   error=(pb.ErrorCode.BAD_REQUEST, reason)), [])  # fmt: skip
    runnable: list[tuple[int, RequestInputs]] = []
    now_ns = time.time_ns()
    for i, (req, group) in enumerate(zip(requests, groups, strict=True)):
        if req is None:
            continue
        try:
            if req.model != model_name:  # a batch is of one model (a direct request names it twice)
                why = f"a request for model {req.model!r} in a batch of {model_name!r}"
                answers[i] = (_error(req, pb.ErrorCode.BAD_REQUEST, why), [])
                continue
            if req.deadlineUnixNs and req.deadlineUnixNs <= now_ns:
                answers[i] = (_error(req, pb.ErrorCode.DEADLINE, "deadline passed before execution"), [])
                continue
            wanted = req.modelVersion or ""
            if wanted and wanted != model.spec.version:  # named a version that a redeploy replaced
                served = model.spec.version
                why = f"model {model_name!r} version {wanted!r} is not served; version {served!r} is"
                answers[i] = (_error(req, pb.ErrorCode.NOT_FOUND, why), [])
                continue
            tensors = _inputs(req, group[1:], shm)
            model.spec.validate(tensors)
            inputs = {t.name: t.data for t in tensors}
            model.check_request(inputs)
        except (TensorError, SpecError) as exc:
            answers[i] = (_error(req, pb.ErrorCode.BAD_REQUEST, str(exc)), [])
            continue
        runnable.append((i, inputs))
        pending.rows.append(
            tensors[0].shape[0] if model.spec.max_batch > 0 and tensors and tensors[0].shape else 1
        )
    pending.requests, pending.answers, pending.runnable = requests, answers, runnable
    pending.priority = min((int(requests[i].priority) for i, _ in runnable), default=0)
    if prepare and runnable:
        _prepare(pending, model)
    pending.busy_s = time.perf_counter() - t0
    pending.copy_in_ns = (t0_ns, time.perf_counter_ns())
    return pending


def finish_batch(pending: Pending) -> tuple[pb.BatchResultT, list[Any]]:
    """Run the model on a pending batch (the compute thread) and frame every answer."""
    t0 = time.perf_counter()
    result, model = pending.result, pending.model
    if model is None or result.error is not None:
        return result, []
    requests, answers, runnable, queue_us = (
        pending.requests,
        pending.answers,
        pending.runnable,
        pending.queue_us,
    )
    stamps = [*pending.copy_in_ns]  # copy-in; then run start, run end, copy-out end (perf ns)
    prepare_ns = 0  # a lone batch's prepare (tokenization) when it ran here: input time, not infer
    if runnable and pending.prepared is _UNPREPARED and model.prepares:
        t_prep = time.perf_counter_ns()
        if not _prepare(pending, model):
            return result, []
        prepare_ns = time.perf_counter_ns() - t_prep
    if runnable:
        stamps.append(time.perf_counter_ns())
        try:
            if pending.prepared is _UNPREPARED:
                produced_all = model.run([inputs for _, inputs in runnable])
            else:
                produced_all = model.run_prepared(pending.prepared)
        except Exception as exc:  # a model bug must not kill the executor; every request hears it
            if is_device_fault(exc):
                raise  # the compute loop answers the batch, then the executor restarts clean
            result.error = codec.error(pb.ErrorCode.INTERNAL, f"model {model.spec.name!r} failed: {exc}")
            return result, []
        stamps.append(time.perf_counter_ns())
        specs = {s.name: s for s in model.spec.outputs}
        ran: list[tuple[int, list[tuple[HostTensor, int]], list[Any]]] = []  # copy-out, then envelopes
        size = 0
        for (i, _), produced, n_rows in zip(runnable, produced_all, pending.rows, strict=True):
            req = requests[i]
            wanted = list(req.outputs or ()) or list(produced)
            missing = [n for n in wanted if n not in produced]
            if missing:
                answers[i] = (_error(req, pb.ErrorCode.BAD_REQUEST, f"model has no outputs {missing}"), [])
                continue
            payloads: list[Any] = []
            tensors = [HostTensor.from_array(n, specs[n].datatype, produced[n]) for n in wanted]
            ran.append((i, codec.tensor_frames(tensors, payloads), payloads))
            size += n_rows
        stamps.append(time.perf_counter_ns())
        timing = codec.BatchTiming(
            size=size,
            input_us=(stamps[1] - stamps[0] + prepare_ns) // 1000,
            infer_us=(stamps[3] - stamps[2]) // 1000,
            output_us=(stamps[4] - stamps[3]) // 1000,
            exec_queue_us=pending.queued_us,
            dispatched_unix_ns=pending.dispatched_unix_ns,
            executor_in_unix_ns=pending.received_unix_ns,
            done_unix_ns=time.time_ns(),
        )
        compute_us = int((time.perf_counter() - t0 + pending.busy_s) * 1e6)
        for index, (i, outputs, payloads) in enumerate(ran):
            req = requests[i]
            env = codec.build_response(
                request_id=req.requestId,
                trace_id=req.traceId,
                model=req.model,
                version=model.spec.version,  # the version that answered (requests may name none)
                outputs=outputs,
                queue_us=queue_us[i] if i < len(queue_us) else 0,
                compute_us=compute_us,
                batch=timing,
                batch_index=index,  # 0: the gateway that gets this answer counts the batch
            )
            answers[i] = (env, payloads)

    pending.answer_groups = [(i, [a[0], *a[1]]) for i, a in enumerate(answers) if a is not None]
    out = [frame for _, group in pending.answer_groups for frame in group]
    result.frameCounts = [len(group) for _, group in pending.answer_groups]
    result.computeUs = int((time.perf_counter() - t0 + pending.busy_s) * 1e6)
    pending.stamps = stamps
    return result, out


def _prepare(pending: Pending, model: Model) -> bool:
    """The model's `prepare` of the batch's runnable requests into ``pending.prepared``; a model bug
    is the whole batch's error (as a failure of run would be) and False."""
    try:
        pending.prepared = model.prepare([inputs for _, inputs in pending.runnable])
        return True
    except Exception as exc:
        pending.result.error = codec.error(pb.ErrorCode.INTERNAL, f"model {model.spec.name!r} failed: {exc}")
        return False


def account_batch(pending: Pending, result: pb.BatchResultT) -> None:
    """A finished batch's spans (when tracing) and its requests' hop "compute", once per request that
    ran, by its priority. Called after its answers went out: nobody waits on this (a batch of 32
    requests observed 32 histograms before its answers left)."""
    model = pending.model
    if model is None or not pending.stamps:  # not run (no model, or its error): nothing to account
        return
    requests, runnable = pending.requests, pending.runnable
    if tracing.ON:
        batch_id, where = result.batchId or "", (result.executorId or "", result.device or "")
        stamps, n = pending.stamps, len(runnable)
        batch_spans.record(batch_id, pending.traceparent, model.spec.name, requests, n, stamps, *where)
    for i, _ in runnable:
        m.hop("compute", int(requests[i].priority)).observe(result.computeUs)


def _error(req: Any, code: int, reason: str) -> bytes:
    return codec.build_response(
        request_id=req.requestId, trace_id=req.traceId, model=req.model, error=(code, reason)
    )
