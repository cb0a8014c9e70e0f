"""Turns a wire Batch into model calls and a wire BatchResult. Runs on the compute thread: no sockets."""

from __future__ import annotations

import time
from typing import Any

from anvil_core import wire
from anvil_core.model_spec import SpecError
from anvil_core.tensors import HostTensor, TensorError
from anvil_core.wire import pb

from anvil_executor.models import Model, RequestInputs

__all__ = ["run_batch"]


def run_batch(
    models: dict[str, Model], batch: pb.BatchT, frames: list[Any], executor_id: str, device: str
) -> tuple[pb.BatchResultT, list[Any]]:
    """Run every request of `batch`; returns the result and its output frames.

    A request whose tensors do not decode or fit the spec gets its own BAD_REQUEST; the rest of the
    batch still runs. A model failure fails the whole batch (every request gets the error).
    """
    t0 = time.perf_counter()
    result = pb.BatchResultT()
    result.batchId = batch.batchId
    result.executorId = executor_id
    result.device = device
    result.responses = []
    out_frames: list[Any] = []
    model_name = wire.text(batch.model)
    model = models.get(model_name)
    if model is None:
        result.error = wire.error(pb.ErrorCode.NOT_FOUND, f"model {model_name!r} is not loaded here")
        return result, out_frames

    requests = list(batch.requests or [])
    responses: list[pb.InferResponseT | None] = [None] * len(requests)  # batch order is kept
    runnable: list[tuple[int, pb.InferRequestT, RequestInputs]] = []
    for i, req in enumerate(requests):
        try:
            tensors = [wire.decode_tensor(t, frames) for t in req.inputs or []]
            model.spec.validate(tensors)
        except (TensorError, SpecError) as exc:
            responses[i] = _response(req, error=wire.error(pb.ErrorCode.BAD_REQUEST, str(exc)))
            continue
        runnable.append((i, req, {t.name: t.data for t in tensors}))

    if runnable:
        try:
            outputs = model.run([inputs for _, _, inputs in runnable])
        except Exception as exc:  # a model bug must not kill the executor; every request hears it
            result.error = wire.error(pb.ErrorCode.INTERNAL, f"model {model_name!r} failed: {exc}")
            result.responses = []
            return result, []
        specs = {s.name: s for s in model.spec.outputs}
        for (i, req, _), produced in zip(runnable, outputs, strict=True):
            wanted = [wire.text(n) for n in (req.outputs or [])] or list(produced)
            resp = _response(req)
            encoded: list[pb.TensorT] = []
            for name in wanted:
                if name not in produced:
                    resp = _response(
                        req,
                        error=wire.error(
                            pb.ErrorCode.BAD_REQUEST, f"model {model_name!r} has no output {name!r}"
                        ),
                    )
                    break
                tensor = HostTensor.from_array(name, specs[name].datatype, produced[name])
                encoded.append(wire.encode_tensor(tensor, out_frames))
            else:
                resp.outputs = encoded
            responses[i] = resp
    result.responses = [r for r in responses if r is not None]
    result.computeUs = int((time.perf_counter() - t0) * 1e6)
    return result, out_frames


def _response(req: pb.InferRequestT, error: pb.ErrorT | None = None) -> pb.InferResponseT:
    resp = pb.InferResponseT()
    resp.requestId = req.requestId
    resp.traceId = req.traceId
    resp.model = req.model
    resp.modelVersion = req.modelVersion
    resp.error = error
    return resp
