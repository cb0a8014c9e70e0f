"""Validation of what peers send the scheduler, before any field is used (issue #18).

The scheduler reads a few fields of each InferRequest (id, model, priority, deadline) and forwards the
rest to an executor untouched; executors send Register, Heartbeat and BatchResult. A crafted message
must cost its sender an error, never the process: every field is checked here against a stated
constraint, and each refusal says which (``Refused.reason`` is the metric label, ``str()`` the text).

What is checked, per InferRequest: request id non-empty UTF-8 of at most 256 bytes; model non-empty
UTF-8 of at most 256 bytes; trace id UTF-8 of at most 256 bytes; priority one of the configured classes;
deadline > 0 ns since the epoch; at most 64 input tensors, each with a known dtype, at most 8 dimensions,
none negative, a payload either in a frame that exists and holds exactly shape x itemsize bytes, or in
shared memory with a named region and a length under 1 TiB; and every payload frame is some tensor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core import fbread
from anvil_core.tensors import DATATYPES
from anvil_core.wire import pb

__all__ = ["MAX_TEXT_BYTES", "CheckedRequest", "Refused", "check_register", "check_request", "text_field"]

MAX_TEXT_BYTES = 256  # ids and names: a UUID is 36, a model name a few dozen
MAX_INPUTS = 64  # a model with more inputs than this is not one we serve
MAX_DIMS = 8
MAX_SHM_BYTES = 1 << 40  # 1 TiB: no region is larger; larger is a crafted length
MAX_BATCH = 4096  # the largest batch an executor may declare (the queue bound is 4096 too)
MAX_CREDITS = 64

_DTYPES: dict[int, int | None] = {}  # dtype code -> itemsize (None: variable-size BYTES)
for _name, _code in vars(pb.DType).items():
    if not _name.startswith("_") and isinstance(_code, int) and _name in DATATYPES:
        _np = DATATYPES[_name]
        _DTYPES[_code] = None if _np is None else _np.itemsize


class Refused(Exception):
    """A peer message that breaks a constraint. ``reason``: a short label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CheckedRequest:
    request_id: str
    model: str
    trace_id: str
    priority: int
    deadline_unix_ns: int


def text_field(raw: bytes | None, field: str, required: bool = True) -> str:
    """A string field as text: UTF-8, at most MAX_TEXT_BYTES, non-empty when ``required``."""
    if not raw:
        if required:
            raise Refused(field, f"{field} is empty; it must be a non-empty UTF-8 string")
        return ""
    if len(raw) > MAX_TEXT_BYTES:
        raise Refused(field, f"{field} is {len(raw)} bytes; at most {MAX_TEXT_BYTES} are allowed")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise Refused(field, f"{field} is not valid UTF-8") from None


def check_request(view: pb.InferRequest, frames: Sequence[Any], priorities: frozenset[int]) -> CheckedRequest:
    """Every field the scheduler or an executor relies on, or Refused. ``frames``: the payload frames
    that follow the envelope."""
    rid = text_field(view.RequestId(), "request_id")
    model = text_field(view.Model(), "model")
    trace = text_field(view.TraceId(), "trace_id", required=False)
    priority = view.Priority()
    if priority not in priorities:
        raise Refused("priority", f"priority {priority} is not one of the classes {sorted(priorities)}")
    deadline = view.DeadlineUnixNs()
    if deadline <= 0:
        raise Refused("deadline", f"deadline_unix_ns is {deadline}; it must be > 0 (ns since the epoch)")
    n_inputs = view.InputsLength()
    if n_inputs > MAX_INPUTS:
        raise Refused("inputs", f"{n_inputs} input tensors; at most {MAX_INPUTS} are allowed")
    used = [False] * len(frames)
    for i in range(n_inputs):
        t = view.Inputs(i)
        if t is None:
            raise Refused("inputs", f"input {i} is missing")
        _check_tensor(t, i, frames, used)
    if not all(used):
        raise Refused("frames", f"{len(frames)} payload frames but only {sum(used)} belong to a tensor")
    return CheckedRequest(rid, model, trace, priority, deadline)


def _check_tensor(t: Any, i: int, frames: Sequence[Any], used: list[bool]) -> None:
    code = t.Dtype()
    if code not in _DTYPES:
        raise Refused("dtype", f"input {i}: unknown dtype code {code}")
    n_dims = t.ShapeLength()
    if n_dims > MAX_DIMS:
        raise Refused("shape", f"input {i}: {n_dims} dimensions; at most {MAX_DIMS} are allowed")
    count = 1
    for d, dim in enumerate(fbread.shape(t)):  # one unpack; the length was bounded just above
        if dim < 0:
            raise Refused("shape", f"input {i}: dimension {d} is {dim}; dimensions must be >= 0")
        count *= dim
    itemsize = _DTYPES[code]
    index = t.Frame()
    if index < 0:
        shm = t.Shm()
        if shm is None:
            raise Refused("frames", f"input {i}: no frame (index {index}) and no shared-memory reference")
        text_field(shm.Region(), f"input {i} shm region")
        if shm.Length() > MAX_SHM_BYTES:
            raise Refused("size", f"input {i}: shm length {shm.Length()} is over {MAX_SHM_BYTES} bytes")
        return
    if index >= len(frames):
        raise Refused("frames", f"input {i}: frame {index} does not exist ({len(frames)} payload frames)")
    if used[index]:
        raise Refused("frames", f"input {i}: frame {index} is already another input's")
    used[index] = True
    if itemsize is not None:
        size = _nbytes(frames[index])
        if size != count * itemsize:
            raise Refused("size", f"input {i}: frame holds {size} bytes, shape needs {count} x {itemsize}")


def _nbytes(frame: Any) -> int:
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    return memoryview(buf).nbytes


def check_register(reg: pb.RegisterT) -> dict[str, int]:
    """An executor's Register: model name -> max batch, or Refused."""
    max_batch, credits = reg.maxBatch, reg.credits
    if not 0 <= max_batch <= MAX_BATCH or not 0 <= credits <= MAX_CREDITS:
        raise Refused(
            "register", f"max_batch {max_batch} / credits {credits} outside 0..{MAX_BATCH} / 0..{MAX_CREDITS}"
        )
    models: dict[str, int] = {}
    for spec in reg.models or []:
        name = spec.name if isinstance(spec.name, bytes) else (spec.name or "").encode()
        model = text_field(name, "model name")
        if not 0 <= spec.maxBatch <= MAX_BATCH:
            raise Refused("register", f"model {model!r}: max_batch {spec.maxBatch} outside 0..{MAX_BATCH}")
        models[model] = max(1, spec.maxBatch)
    return models
