"""The InferRequest envelope a ZeroCopy INFER becomes, and the outputs of the InferResponse that
comes back; both through the wire codec (the envelope is written per request: ~12 µs, see
bench/results/codec.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anvil_core import codec
from anvil_core.zerocopy.header import Status, ZeroCopyError

__all__ = ["request_envelope", "response_outputs"]


def request_envelope(
    *,
    request_id: str,
    trace_id: str,
    model: str,
    version: str,
    priority: int,
    deadline_unix_ns: int,
    tenant: str,
    region: str,
    slot_base: int,
    inputs: Sequence[tuple[str, str, tuple[int, ...], int, int]],
    outputs: Sequence[str],
) -> bytes:
    """`inputs` are (name, datatype, shape, offset within the slot, length); each becomes a ShmRef
    to (region, slot_base + offset, length), which the executor reads in place."""
    spans = [
        (name, dt, shape, codec.ShmSpan(region, slot_base + off, length))
        for name, dt, shape, off, length in inputs
    ]
    return codec.build_request(
        request_id=request_id,
        trace_id=trace_id,
        model=model,
        version=version,
        priority=priority,
        deadline_unix_ns=deadline_unix_ns,
        tenant=tenant,
        shm_inputs=spans,
        outputs=outputs,
    )


def response_outputs(
    resp: codec.pb.InferResponseT, frames: Sequence[Any]
) -> tuple[list[tuple[str, str, tuple[int, ...], int]], list[memoryview]]:
    """(name, datatype, shape, bytes) per output of a verified response, and the frame buffers that
    hold them (no copy)."""
    try:
        codec.check_payloads(resp.outputs, frames, "output")
    except codec.ProtocolError as exc:
        raise ZeroCopyError(Status.INTERNAL, f"malformed outputs from the executor: {exc}") from None
    tensors, buffers = [], []
    for t in resp.outputs or ():
        if t.frame < 0:
            raise ZeroCopyError(Status.INTERNAL, f"output {t.name!r} names no frame")
        buf = memoryview(codec.buffer_of(frames[t.frame])).cast("B")
        tensors.append((t.name or "", codec.DTYPE_NAMES[t.dtype], tuple(t.shape or ()), buf.nbytes))
        buffers.append(buf)
    return tensors, buffers
