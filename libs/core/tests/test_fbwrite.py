"""The front-to-back flatbuffers writer against the `flatbuffers` package's own Builder.

Random messages are built both ways (the hot-path codecs use fbwrite; the reference is the
generated object API packed by flatbuffers.Builder) and decoded with the generated object API:
every field must agree. Alignment of 8-byte scalars is checked on the raw bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from anvil_core import infer_codec as codec
from anvil_core import wire
from anvil_core.fbwrite import Node, Str, TableDef, Vec, encode
from anvil_core.tensors import HostTensor
from anvil_core.wire import pb

_text = st.text(max_size=40)
_name = st.text(min_size=1, max_size=12)
_shape = st.lists(st.integers(0, 2**62), max_size=5)
_dtype = st.sampled_from(sorted(wire.DTYPE_CODES))


def _fields(obj: Any) -> Any:
    """An object-API value as plain data (numpy vectors as lists, bytes as str)."""
    if isinstance(obj, bytes):
        return obj.decode()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, list):
        return [_fields(v) for v in obj]
    if hasattr(obj, "__dict__"):
        return {k: _fields(v) for k, v in vars(obj).items()}
    return obj


def _tensor_t(name: str, dtype: str, shape: list[int], frame: int, span: codec.ShmSpan | None) -> pb.TensorT:
    t = pb.TensorT()
    t.name, t.dtype, t.shape, t.frame = name, wire.DTYPE_CODES[dtype], shape, frame
    if span is not None:
        t.shm = pb.ShmRefT()
        t.shm.region, t.shm.offset, t.shm.length = span.region, span.offset, span.length
    return t


_span = st.builds(codec.ShmSpan, _name, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))


@settings(max_examples=300, deadline=None)
@given(
    rid=_text,
    trace=_text,
    model=_text,
    version=_text,
    priority=st.integers(0, 255),
    deadline=st.integers(-(2**63), 2**63 - 1),
    tenant=_text,
    shm_inputs=st.lists(st.tuples(_name, _dtype, _shape, _span), max_size=3),
    outputs=st.lists(_text, max_size=3),
)
def test_request_matches_the_reference_builder(
    rid: str,
    trace: str,
    model: str,
    version: str,
    priority: int,
    deadline: int,
    tenant: str,
    shm_inputs: list[tuple[str, str, list[int], codec.ShmSpan]],
    outputs: list[str],
) -> None:
    frames: list[Any] = []
    x = HostTensor.from_array("x", "FP32", np.zeros((2, 3), np.float32))
    fast = codec.build_request(
        request_id=rid,
        trace_id=trace,
        model=model,
        version=version,
        priority=priority,
        deadline_unix_ns=deadline,
        tenant=tenant,
        inputs=codec.tensor_frames([x], frames),
        shm_inputs=shm_inputs,
        outputs=outputs,
    )
    ref = pb.InferRequestT()
    ref.requestId, ref.traceId, ref.model, ref.modelVersion = rid, trace, model, version
    ref.priority, ref.deadlineUnixNs, ref.tenant = priority, deadline, tenant
    ref.inputs = [_tensor_t("x", "FP32", [2, 3], 0, None)]
    ref.inputs += [_tensor_t(n, d, s, -1, span) for n, d, s, span in shm_inputs]
    ref.outputs = outputs or None
    got, _ = wire.unpack([fast])
    want, _ = wire.unpack(wire.pack(ref))
    assert _fields(got) == _fields(want)
    view = codec.open_request(fast)
    assert view.DeadlineUnixNs() == deadline and view.Priority() == priority
    _assert_aligned(fast, view)


@settings(max_examples=200, deadline=None)
@given(
    rid=_text,
    model=_text,
    outputs=st.lists(st.tuples(_name, _dtype, st.lists(st.integers(0, 9), max_size=4)), max_size=3),
    error=st.none() | st.tuples(st.sampled_from(sorted(wire.ERROR_NAMES)), _text),
    queue_us=st.integers(-5, 2**40),
    compute_us=st.integers(0, 2**32 - 1),
)
def test_response_matches_the_reference_builder(
    rid: str,
    model: str,
    outputs: list[tuple[str, str, list[int]]],
    error: tuple[int, str] | None,
    queue_us: int,
    compute_us: int,
) -> None:
    # the writer reads only name, datatype and shape of an output tensor
    stand_ins = [(_Meta(n, d, tuple(s)), i) for i, (n, d, s) in enumerate(outputs)]
    fast = codec.build_response(
        request_id=rid,
        trace_id="t",
        model=model,
        version="v",
        outputs=stand_ins,  # type: ignore[arg-type]
        error=error,
        queue_us=queue_us,
        compute_us=compute_us,
    )
    ref = pb.InferResponseT()
    ref.requestId, ref.traceId, ref.model, ref.modelVersion = rid, "t", model, "v"
    ref.outputs = [_tensor_t(n, d, s, i, None) for i, (n, d, s) in enumerate(outputs)]
    if error is not None:
        ref.error = pb.ErrorT()
        ref.error.code, ref.error.reason = error
    ref.queueUs, ref.computeUs = max(0, min(queue_us, 2**32 - 1)), compute_us
    got, _ = wire.unpack([fast])
    want, _ = wire.unpack(wire.pack(ref))
    assert _fields(got) == _fields(want)


class _Meta:
    def __init__(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        self.name, self.datatype, self.shape = name, datatype, shape


def _assert_aligned(buf: bytes, view: pb.InferRequest) -> None:
    """8-byte scalars (the deadline, each shape vector's elements) sit at 8-aligned positions."""
    tab = view._tab
    vt = tab.Pos - struct.unpack_from("<i", buf, tab.Pos)[0]
    deadline_off = struct.unpack_from("<H", buf, vt + 4 + 2 * 5)[0]
    assert (tab.Pos + deadline_off) % 8 == 0
    for i in range(view.InputsLength()):
        t = view.Inputs(i)
        o = t._tab.Offset(8)  # shape (slot 2)
        if o:
            assert t._tab.Vector(o) % 8 == 0


def test_nested_tables_vectors_and_absent_fields() -> None:
    inner = TableDef([(0, "H"), (1, "off")])
    outer = TableDef([(0, "off"), (2, "q"), (3, "off")])
    buf = encode(Node(outer, {0: Vec("off", [Node(inner, {0: 7, 1: Str(b"ab")})]), 2: -3, 3: None}))
    (root,) = struct.unpack_from("<I", buf, 0)
    vt = root - struct.unpack_from("<i", buf, root)[0]
    vt_size, table_size, f0, f1, f2, f3 = struct.unpack_from("<6H", buf, vt)
    assert (vt_size, f1, f3) == (12, 0, 0)  # slot 1 never declared, slot 3 absent
    assert table_size == 24  # soffset, pad, the long at 8, two references
    assert struct.unpack_from("<q", buf, root + f2)[0] == -3 and (root + f2) % 8 == 0
    vec = root + f0 + struct.unpack_from("<I", buf, root + f0)[0]
    assert struct.unpack_from("<I", buf, vec)[0] == 1
    elem = vec + 4
    table = elem + struct.unpack_from("<I", buf, elem)[0]
    ivt = table - struct.unpack_from("<i", buf, table)[0]
    _, _, code_off, reason_off = struct.unpack_from("<4H", buf, ivt)
    assert struct.unpack_from("<H", buf, table + code_off)[0] == 7
    s = table + reason_off + struct.unpack_from("<I", buf, table + reason_off)[0]
    assert buf[s : s + 7] == b"\x02\x00\x00\x00ab\x00"


def _reference_pack(body: Any, body_type: int) -> bytes:
    """The object API's own Pack through flatbuffers.Builder (what wire.pack did before fbwrite)."""
    import flatbuffers

    env = pb.EnvelopeT()
    env.version, env.bodyType, env.body = wire.PROTOCOL_VERSION, body_type, body
    b = flatbuffers.Builder(256)
    b.Finish(env.Pack(b))
    return bytes(b.Output())


_counts = st.none() | st.lists(st.integers(0, 2**32 - 1), max_size=70)


@settings(max_examples=200, deadline=None)
@given(bid=_text, model=st.none() | _text, counts=_counts, queue=_counts)
def test_batch_matches_the_object_api(bid: str, model: str | None, counts: Any, queue: Any) -> None:
    b = pb.BatchT()
    b.batchId, b.model, b.frameCounts, b.queueUs = bid, model, counts, queue
    got, _ = wire.unpack(wire.pack(b))
    want, _ = wire.unpack([_reference_pack(b, pb.Body.Batch)])
    assert _fields(got) == _fields(want)


@settings(max_examples=200, deadline=None)
@given(
    bid=_text,
    device=_text,
    compute_us=st.integers(0, 2**32 - 1),
    error=st.none() | st.tuples(st.sampled_from(sorted(wire.ERROR_NAMES)), _text),
    counts=_counts,
)
def test_batch_result_matches_the_object_api(
    bid: str, device: str, compute_us: int, error: tuple[int, str] | None, counts: Any
) -> None:
    r = pb.BatchResultT()
    r.batchId, r.executorId, r.device, r.computeUs, r.frameCounts = bid, "ex-1", device, compute_us, counts
    r.error = None if error is None else wire.error(*error)
    got, _ = wire.unpack(wire.pack(r))
    want, _ = wire.unpack([_reference_pack(r, pb.Body.BatchResult)])
    assert _fields(got) == _fields(want)
