"""The fast views (fbread) read what the generated accessors read, field by field.

Random requests and responses are written both by the hot-path writer (fbwrite) and by the
`flatbuffers` package's Builder; each is read through the generated classes over the stock
`flatbuffers.table.Table` and through `infer_codec.open_request/open_response` (FastTable).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anvil_core import fbread, wire
from anvil_core import infer_codec as codec
from anvil_core.fbread import FastTable
from anvil_core.wire import pb

_text = st.text(max_size=30)
_name = st.text(min_size=1, max_size=10)
_shape = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)
_dtype = st.sampled_from(sorted(wire.DTYPE_CODES.values()))
_span = st.none() | st.tuples(_name, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
_tensors = st.tuples(_name, _dtype, _shape, st.integers(-(2**31), 2**31 - 1), _span)


def _tensor_t(name: str, dtype: int, shape: list[int], frame: int, span: Any) -> pb.TensorT:
    t = pb.TensorT()
    t.name, t.dtype, t.shape, t.frame = name, dtype, shape, frame
    if span is not None:
        t.shm = pb.ShmRefT()
        t.shm.region, t.shm.offset, t.shm.length = span
    return t


def _tensor(t: Any) -> Any:
    shm = t.Shm()
    shape = t.ShapeAsNumpy() if t.ShapeLength() else []
    assert fbread.shape(t) == tuple(np.asarray(shape).tolist())
    return (
        t.Name(), t.Dtype(), list(np.asarray(shape).tolist()), t.ShapeLength(), t.Frame(),
        None if shm is None else (shm.Region(), shm.Offset(), shm.Length()),
    )  # fmt: skip


def _request(v: Any) -> Any:
    return (
        v.RequestId(), v.TraceId(), v.Model(), v.ModelVersion(), v.Priority(), v.DeadlineUnixNs(),
        v.Tenant(), [_tensor(v.Inputs(j)) for j in range(v.InputsLength())], v.InputsIsNone(),
        [v.Outputs(k) for k in range(v.OutputsLength())], v.OutputsIsNone(),
    )  # fmt: skip


def _response(v: Any) -> Any:
    err = v.Error()
    return (
        v.RequestId(), v.TraceId(), v.Model(), v.ModelVersion(), v.QueueUs(), v.ComputeUs(),
        [_tensor(v.Outputs(j)) for j in range(v.OutputsLength())], v.OutputsIsNone(),
        None if err is None else (err.Code(), err.Reason()),
    )  # fmt: skip


def _generated(buf: bytes, cls: type) -> Any:
    env = pb.Envelope.GetRootAs(buf, 0)
    table = env.Body()
    view = cls()
    view.Init(table.Bytes, table.Pos)
    assert type(view._tab) is not FastTable
    return view


_ids = st.tuples(_text, _text, _text, _text)


@settings(max_examples=300, deadline=None)
@given(
    ids=_ids,
    priority=st.integers(0, 255),
    deadline=st.integers(-(2**63), 2**63 - 1),
    tenant=st.none() | _text,
    inputs=st.none() | st.lists(_tensors, max_size=3),
    outputs=st.none() | st.lists(_text, max_size=3),
)
def test_request_fields_agree(
    ids: tuple[str, ...], priority: int, deadline: int, tenant: str | None, inputs: Any, outputs: Any
) -> None:
    ref = pb.InferRequestT()
    ref.requestId, ref.traceId, ref.model, ref.modelVersion = ids
    ref.priority, ref.deadlineUnixNs, ref.tenant = priority, deadline, tenant
    ref.inputs = None if inputs is None else [_tensor_t(*t) for t in inputs]
    ref.outputs = outputs
    buf = wire.pack(ref)[0]
    fast = codec.open_request(buf)
    assert type(fast._tab) is FastTable and all(
        type(fast.Inputs(j)._tab) is FastTable for j in range(fast.InputsLength())
    )
    assert _request(fast) == _request(_generated(buf, pb.InferRequest))


@settings(max_examples=300, deadline=None)
@given(
    ids=_ids,
    queue_us=st.integers(0, 2**32 - 1),
    compute_us=st.integers(0, 2**32 - 1),
    outputs=st.none() | st.lists(_tensors, max_size=3),
    error=st.none() | st.tuples(st.integers(0, 2**16 - 1), st.none() | _text),
)
def test_response_fields_agree(
    ids: tuple[str, ...], queue_us: int, compute_us: int, outputs: Any, error: Any
) -> None:
    ref = pb.InferResponseT()
    ref.requestId, ref.traceId, ref.model, ref.modelVersion = ids
    ref.queueUs, ref.computeUs = queue_us, compute_us
    ref.outputs = None if outputs is None else [_tensor_t(*t) for t in outputs]
    if error is not None:
        ref.error = pb.ErrorT()
        ref.error.code, ref.error.reason = error
    buf = wire.pack(ref)[0]
    assert _response(codec.open_response(buf)) == _response(_generated(buf, pb.InferResponse))


def test_the_hot_path_writer_reads_back_the_same() -> None:
    """fbwrite's layout (front to back) through both readers."""
    env = codec.build_response(
        request_id="r", trace_id="t", model="m", version="2", error=(pb.ErrorCode.DEADLINE, "late")
    )
    assert _response(codec.open_response(env)) == _response(_generated(env, pb.InferResponse))
    assert codec.open_response(env).Error().Reason() == b"late"


@pytest.mark.parametrize("garbage", [b"", b"\x01\x00", b"\xff" * 64, b"\x04\x00\x00\x00" * 3])
def test_garbage_is_still_a_protocol_error(garbage: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        codec.open_request(garbage)
