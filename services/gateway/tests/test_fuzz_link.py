"""Fuzzing the gateway's link to the scheduler through real sockets (issue #18): a stand-in
scheduler (ROUTER on tcp) sends random, mutated-valid and truncated messages to a real
`SchedulerLink`; after every chunk a real request is still answered (so no message stopped or hung
the receive loop), and nothing grows: no pending entries, drop labels from the fixed set only."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import REGISTRY

from anvil_core import codec
from anvil_core.tensors import HostTensor
from anvil_gateway.backend import SchedulerLink

CHUNK = 200  # fuzz messages between two checks that a real request is still answered


def _response(rid: str, n: int = 4) -> list[bytes]:
    out = HostTensor.from_buffer("o", "UINT8", (n,), bytes(n))
    env = codec.build_response(request_id=rid, trace_id="t", model="m", outputs=[(out, 0)], compute_us=3)
    return [env, bytes(n)]


def _request(rid: str) -> list[bytes]:
    return [codec.build_request(request_id=rid, trace_id="t", model="m", version="1", priority=2,
                                deadline_unix_ns=2**62, tenant="")]  # fmt: skip


def _seeds() -> list[list[bytes]]:
    err = [codec.build_response(request_id="e", trace_id="t", model="m", error=(4, "shed"))]
    return [_response("a"), err, codec.bundle([_response("b"), _response("c", 8), err], responses=True)]


def _drop_series() -> int:
    return sum(
        1 for m in REGISTRY.collect() if m.name == "anvil_dropped_messages" for s in m.samples
        if s.name.endswith("_total")
    )  # fmt: skip


def test_fuzzed_scheduler_messages_never_stop_the_link(fuzz: Any) -> None:
    n = fuzz.cases(1500)
    seeds = _seeds()

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = SchedulerLink("gw-fuzz", bundle_max=1)
        monitor = link.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        link.follow(f"tcp://127.0.0.1:{port}")
        link.start()
        try:
            await asyncio.wait_for(monitor.recv_multipart(), 10)
            link.sock.disable_monitor()
            monitor.close()
            sent = 0
            while sent < n:
                rid = f"probe-{sent}"
                call = asyncio.ensure_future(link.infer(rid, _request(rid), 30))
                ident, *_ = await asyncio.wait_for(router.recv_multipart(), 30)
                for _ in range(min(CHUNK, n - sent)):
                    await router.send_multipart([ident, *fuzz.message(seeds)])
                    sent += 1
                await router.send_multipart([ident, *_response(rid)])
                resp, frames = await asyncio.wait_for(call, 30)  # in order: every fuzz message was read
                assert resp.requestId == rid and bytes(frames[0]) == bytes(4)
                assert link.alive and not link.pending
            assert set(link.drops.counts) <= codec.REASONS and sum(link.drops.counts.values()) > n // 10
            assert len(link.drops._next_s) <= len(codec.REASONS)
            assert _drop_series() <= 8 * len(codec.REASONS)  # services x fixed reasons, not per input
        finally:
            await link.stop()
            router.close()
            ctx.term()

    t0 = time.monotonic()
    asyncio.run(main())
    fuzz.record("gateway link (real sockets)", n, crashes=0, hangs=0, seconds=round(time.monotonic() - t0, 1))
