"""Fuzzing every boundary of the real stack (issue #18): random, mutated-valid and truncated messages
to the scheduler's two ports, random methods/paths/headers/bodies to the HTTP edge, random doorbells
and mutated slot metadata to the ZeroCopy edge, all over real sockets to `anvil up`'s processes.

After every chunk a good request must still be answered (no crash, no hang); at the end the process
is the same one, its RSS grew by less than RSS_GROWTH_MB and its /metrics by a bounded number of
lines (series come only from fixed label sets, never from input). CI runs `fuzz.cases(ci)` inputs per
boundary; bench/fuzz_long.py runs 100,000 (ANVIL_FUZZ_CASES).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import numpy as np
import pytest
import zmq

from anvil_client import ZeroCopyClient
from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_core.zerocopy import header as zh
from anvil_core.zmq_sockets import make_socket

pytestmark = pytest.mark.integration

CHUNK = 250
RSS_GROWTH_MB = 64  # allocator noise and caches; a leak per input would be far past it at 100k
METRIC_LINES_GROWTH = 120  # new series from fixed label sets (drop reasons, outcomes, statuses)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _drops(port: str) -> float:
    """anvil_dropped_messages_total of a service, summed over its reasons."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("anvil_dropped_messages_total{")
    )


def _metric_lines(port: str) -> int:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


class Watch:
    """A service's pid, RSS and metric line count, before and after a fuzz."""

    def __init__(self, stack: Any, name: str) -> None:
        svc = stack.service(name)
        self.pid, self.port = int(svc["pid"]), svc["env"]["ANVIL_METRICS_PORT"]
        self.rss, self.lines, self.drops = _rss_mb(self.pid), _metric_lines(self.port), _drops(self.port)

    def check(self, stack: Any, name: str) -> dict[str, float]:
        assert int(stack.service(name)["pid"]) == self.pid, f"{name} was restarted"
        os.kill(self.pid, 0)
        rss, lines = _rss_mb(self.pid), _metric_lines(self.port)
        assert rss - self.rss < RSS_GROWTH_MB, f"{name} RSS grew {self.rss:.0f} -> {rss:.0f} MB"
        assert lines - self.lines < METRIC_LINES_GROWTH, f"{name} /metrics grew {self.lines} -> {lines} lines"
        drops = _drops(self.port) - self.drops
        return {
            "rss_growth_mb": round(rss - self.rss, 1),
            "metric_lines_growth": lines - self.lines,
            "dropped_counted": int(drops),
        }


def _request(rid: str, **kw: Any) -> list[bytes]:
    x = HostTensor.from_array("INPUT0", "FP32", np.arange(4, dtype=np.float32).reshape(1, 4))
    frames: list[Any] = []
    env = codec.build_request(
        request_id=rid,
        trace_id="t",
        model="identity",
        version="1",
        priority=3,
        deadline_unix_ns=time.time_ns() + 10**10,
        tenant="",
        inputs=codec.tensor_frames([x], frames),
        **kw,
    )
    return [env, *(bytes(f) for f in frames)]


def _served(gw: zmq.Socket[bytes], rid: str, timeout_s: float = 30) -> None:
    """Send a good request and wait for its answer, skipping answers to fuzzed requests."""
    gw.send_multipart(_request(rid))
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if gw.poll(int(left * 1000)):
            for resp, group in codec.unbundle(gw.recv_multipart()):
                if not isinstance(resp, codec.ProtocolError) and resp.requestId == rid:
                    assert resp.error is None, resp.error.reason
                    out = codec.request_tensor(resp.outputs[0], group[1:]).data
                    assert np.array_equal(out, np.arange(4, dtype=np.float32).reshape(1, 4))
                    return
    raise AssertionError(f"the scheduler did not answer {rid} within {timeout_s} s")


def test_fuzz_scheduler_gateway_port(sockets: Any, fuzz: Any) -> None:
    stack, gw, _ = sockets
    n, watch, t0 = fuzz.cases(1500), Watch(stack, "scheduler"), time.monotonic()
    seeds = [
        _request("s1"),
        codec.bundle([_request("s2"), _request("s3", outputs=["OUTPUT0"])], responses=False),
    ]
    sent = 0
    while sent < n:
        for _ in range(min(CHUNK, n - sent)):
            gw.send_multipart(fuzz.message(seeds))
            sent += 1
        _served(gw, f"probe-{sent}")
    checks = watch.check(stack, "scheduler")
    assert checks["dropped_counted"] > n // 10, "the fuzz did not reach the verifier"
    fuzz.record(
        "scheduler gateway port", n, crashes=0, hangs=0, seconds=round(time.monotonic() - t0, 1), **checks
    )


def test_fuzz_scheduler_executor_port(sockets: Any, fuzz: Any) -> None:
    stack, gw, ex = sockets
    n, watch, t0 = fuzz.cases(1500), Watch(stack, "scheduler"), time.monotonic()
    spec = pb.ModelSpecT(name="fuzz-only", version="1", maxBatch=4)  # never a model clients use
    resp = codec.build_response(request_id="nobody", trace_id="t", model="m")
    seeds = [
        codec.pack(
            pb.RegisterT(kind=2, serviceId="fuzz-ex", device="cpu", maxBatch=4, credits=1, models=[spec])
        ),
        codec.pack(pb.HeartbeatT(kind=2, serviceId="fuzz-ex", seq=1)),
        codec.pack(pb.BatchResultT(batchId="999999", executorId="fuzz-ex", frameCounts=[1]), [resp]),
    ]
    sent = 0
    while sent < n:
        for _ in range(min(CHUNK, n - sent)):
            ex.send_multipart(fuzz.message(seeds))
            sent += 1
        _served(gw, f"probe-ex-{sent}")
        while ex.poll(0):  # the scheduler's "unregistered" answers to us
            ex.recv_multipart()
    checks = watch.check(stack, "scheduler")
    assert checks["dropped_counted"] > n // 10, "the fuzz did not reach the verifier"
    fuzz.record(
        "scheduler executor port", n, crashes=0, hangs=0, seconds=round(time.monotonic() - t0, 1), **checks
    )


_PATHS = [
    "/v2/models/identity/infer",
    "/v2/models/identity/versions/1/infer",
    "/v2/models/{r}/infer",
    "/v2/models/{r}/versions/{r}/infer",
    "/v2/models/{r}",
    "/v2/models/identity/versions/{r}/ready",
    "/v1/embeddings",
    "/v2/systemsharedmemory/region/{r}/status",
    "/{r}",
    "/v2/{r}/{r}",
]


def _http_case(fuzz: Any, seeds: list[bytes]) -> tuple[str, str, dict[str, str], bytes]:
    rng = fuzz.rng
    seg = rng.bytes(int(rng.integers(1, 12))).hex()
    path = _PATHS[int(rng.integers(0, len(_PATHS)))].replace("{r}", seg)
    method = ["POST", "POST", "GET", "PUT", "DELETE"][int(rng.integers(0, 5))]
    headers: dict[str, str] = {}
    if rng.random() < 0.5:
        headers["content-type"] = ["application/json", "application/octet-stream", rng.bytes(6).hex()][
            int(rng.integers(0, 3))
        ]
    if rng.random() < 0.3:
        headers["inference-header-content-length"] = str(int(rng.integers(-5, 1 << 20)))
    if rng.random() < 0.2:
        headers["traceparent"] = rng.bytes(int(rng.integers(0, 60))).hex()
    kind = int(rng.integers(0, 3))
    body = (
        rng.bytes(int(rng.integers(0, 300)))
        if kind == 0
        else fuzz.mutate(seeds[int(rng.integers(0, len(seeds)))], seeds)
    )
    return method, path, headers, body


def test_fuzz_http_edge(private_stack: Any, fuzz: Any) -> None:
    stack = private_stack
    good = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        for p in (1, 2, 3):  # the per-hop histograms' fixed label sets exist before the baseline
            doc = {**good, "parameters": {"priority": p}}
            assert client.post("/v2/models/identity/infer", json=doc).status_code == 200
    n, watch, t0 = fuzz.cases(800), Watch(stack, "gateway"), time.monotonic()
    seeds = [
        json.dumps(good).encode(),
        b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1],"data":["x"]}]}',
        json.dumps({"input": ["a b", "c"], "model": "identity"}).encode(),
    ]
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        for i in range(n):
            method, path, headers, body = _http_case(fuzz, seeds)
            r = client.request(method, path, headers=headers, content=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500 or r.status_code == 503, (
                f"{method} {path} -> {r.status_code}: {r.text[:200]}"
            )
            if i % CHUNK == CHUNK - 1:
                assert client.post("/v2/models/identity/infer", json=good).status_code == 200
        assert client.post("/v2/models/identity/infer", json=good).status_code == 200
    fuzz.record(
        "HTTP edge",
        n,
        crashes=0,
        hangs=0,
        seconds=round(time.monotonic() - t0, 1),
        statuses=statuses,
        **watch.check(stack, "gateway"),
    )


def test_fuzz_zerocopy_edge(private_stack: Any, fuzz: Any) -> None:
    """Random doorbells on a bare connection (each answered exactly once), then mutated metadata
    blocks in a registered region's slot (each answered exactly once), then a real request."""
    stack = private_stack
    n, watch, t0 = fuzz.cases(1500), Watch(stack, "gateway"), time.monotonic()
    endpoint = stack.zerocopy_endpoint()
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    ctx = zmq.Context()
    bare = make_socket(ctx, zmq.DEALER, connect=endpoint)
    heads = [
        zh.encode(7, zh.Op.INFER, 256, zh.Flag.META, 0, zh.pack_reserved(1, 0)),
        zh.encode(8, zh.Op.PING),
        zh.encode(9, zh.Op.CANCEL, reserved=3),
        zh.encode(10, zh.Op.UNREGISTER, reserved=1 << 16),
    ]
    with ZeroCopyClient(endpoint, slots=1, slot_bytes=64 << 10) as zc:
        slots = zc._slots
        for i in range(n):
            if i % 2 == 0:  # a doorbell on a connection with no region
                bare.send(fuzz.mutate(heads[i // 2 % len(heads)], heads) if i % 4 else fuzz.rng.bytes(16))
                assert bare.poll(30_000), "a doorbell was not answered"
                bare.recv()
                continue
            head = slots.write(0, slots.next_id(), "identity", {"INPUT0": x}, {"outputs": (), "priority": 0})
            base = slots.region.slot_offset(0)
            block = bytes(
                slots.region.get(
                    base + zh.HEADER_BYTES, 4 + int.from_bytes(slots.region.get(base + 16, 4), "little")
                )
            )
            slots.region.set(base + zh.HEADER_BYTES, fuzz.mutate(block, [block])[: len(block) + 64])
            zc._sock.send(head)
            assert zc._sock.poll(30_000), "an INFER with a mutated block was not answered"
            zc._sock.recv()
        out = zc.infer("identity", {"INPUT0": x})
        assert np.array_equal(out["OUTPUT0"], x)
    bare.close()
    ctx.term()
    checks = watch.check(stack, "gateway")
    assert checks["dropped_counted"] > n // 10, "the fuzz did not reach the checks"
    fuzz.record("ZeroCopy edge", n, crashes=0, hangs=0, seconds=round(time.monotonic() - t0, 1), **checks)
