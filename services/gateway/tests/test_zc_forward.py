"""The InferRequest envelope a ZeroCopy INFER becomes (zc_forward): each input a ShmRef into the slot."""

from __future__ import annotations

from anvil_core import codec
from anvil_gateway.zc_forward import request_envelope


def test_request_envelope_points_each_input_into_the_slot() -> None:
    inputs = [("INPUT0", "FP32", (1, 1024), 128, 4096), ("MASK", "BOOL", (1, 3), 4224, 3)]
    raw = request_envelope(
        request_id="a" * 32, trace_id="b" * 32, model="identity", version="1", priority=1,
        deadline_unix_ns=1_700_000_000_123_456_789, tenant="default", region="zc-00ff00ff-3",
        slot_base=64 + 5 * 8192, inputs=inputs, outputs=["OUTPUT0"],
    )  # fmt: skip
    req = codec.read_request(raw)
    assert (req.requestId, req.priority, req.deadlineUnixNs) == ("a" * 32, 1, 1_700_000_000_123_456_789)
    assert [(t.frame, t.shm.region, t.shm.offset, t.shm.length) for t in req.inputs] == [
        (-1, "zc-00ff00ff-3", 64 + 5 * 8192 + 128, 4096),
        (-1, "zc-00ff00ff-3", 64 + 5 * 8192 + 4224, 3),
    ]
