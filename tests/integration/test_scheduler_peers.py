"""Issue #18 on the real stack: crafted messages to the scheduler's two ports, over real ZeroMQ
sockets, never stop the scheduler process; refused requests with an id are answered with the
constraint; afterwards a good request is served on the same socket and over HTTP."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import numpy as np
import pytest
import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor

pytestmark = pytest.mark.integration


def _request(rid: str | bytes, priority: int = 3, deadline_ns: int | None = None, **kw: Any) -> list[Any]:
    x = HostTensor.from_array("INPUT0", "FP32", np.arange(4, dtype=np.float32).reshape(1, 4))
    frames: list[Any] = []
    inputs = kw.pop("inputs", None) or codec.tensor_frames([x], frames)
    env = codec.build_request(
        request_id=rid,  # type: ignore[arg-type]  # raw bytes, to craft a non-UTF-8 id
        trace_id="t", model="identity", version="1", priority=priority,
        deadline_unix_ns=time.time_ns() + 10**10 if deadline_ns is None else deadline_ns,
        tenant="", inputs=inputs,
    )  # fmt: skip
    return [env, *kw.pop("frames", frames)]


def _crafted() -> dict[str, list[Any]]:
    good = _request("tpl")[0]
    huge = HostTensor("INPUT0", "FP32", (1 << 40, 1 << 20), None)  # type: ignore[arg-type]
    return {
        "priority 7": _request("c-p7", priority=7),
        "truncated envelope": [good[:11]],
        "empty request id": _request(""),
        "non-UTF-8 request id": _request(b"\xff\xfe\xfd"),
        "negative deadline": _request("c-neg", deadline_ns=-1),
        "garbage": [os.urandom(64)],
        "wrong frame counts": codec.bundle([_request("c-b1"), _request("c-b2")], responses=False)[:-1],
        "unknown body type": codec.pack(pb.HeartbeatT(serviceId="gw")),
        "huge declared size": _request("c-huge", inputs=[(huge, 0)]),
        "empty frame": [b""],
    }


def _answers(sock: zmq.Socket[bytes], want: set[str], timeout_s: float = 10) -> dict[str, Any]:
    got: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while not want <= got.keys():
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and sock.poll(left_ms), f"no answer for {sorted(want - got.keys())}"
        for resp, _group in codec.unbundle(sock.recv_multipart()):
            got[resp.requestId] = resp
    return got


def test_crafted_messages_never_stop_the_scheduler(
    sockets: tuple[Any, zmq.Socket[bytes], zmq.Socket[bytes]], idle_means_zero: Any
) -> None:
    stack, gw, ex = sockets
    pid = int(stack.service("scheduler")["pid"])
    for msg in _crafted().values():
        gw.send_multipart(msg)
    # to the executor port: garbage, a result and a heartbeat from nobody, an absurd registration
    reg = pb.RegisterT()
    reg.kind, reg.serviceId, reg.maxBatch, reg.credits = pb.ServiceKind.EXECUTOR, "x", 2**31 - 1, 10**6
    res = pb.BatchResultT()
    res.batchId, res.frameCounts = "1", [5]
    for msg in (
        [os.urandom(40)],
        codec.pack(res, [b"x"]),
        codec.pack(pb.HeartbeatT()),
        codec.pack(reg),
        [b""],
    ):
        ex.send_multipart(msg)
    # the refused requests that carry an id are answered with the constraint they break
    refused = _answers(gw, {"c-p7", "c-neg", "c-huge"})
    for rid, resp in refused.items():
        assert resp.error is not None and resp.error.code == pb.ErrorCode.BAD_REQUEST, rid
    assert "priority is 7" in refused["c-p7"].error.reason
    # and a good request on the same socket is still served
    gw.send_multipart(_request("good"))
    good = _answers(gw, {"good"})["good"]
    assert good.error is None or good.error.code == 0
    os.kill(pid, 0)  # the scheduler process is alive
    r = httpx.post(
        f"{stack.url}/v2/models/identity/infer",
        json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    port = stack.service("scheduler")["env"]["ANVIL_METRICS_PORT"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    dropped = [ln for ln in metrics.splitlines() if ln.startswith("anvil_dropped_messages_total{")]
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in dropped) >= 10, dropped
    idle_means_zero(stack)


def test_a_heartbeat_from_an_unknown_identity_is_told_to_register(
    sockets: tuple[Any, zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    _, _, ex = sockets
    ex.send_multipart(codec.pack(pb.HeartbeatT()))
    assert ex.poll(10_000)
    body, _ = codec.unpack(ex.recv_multipart())
    assert isinstance(body, pb.ErrorT) and body.code == pb.ErrorCode.UNAVAILABLE
