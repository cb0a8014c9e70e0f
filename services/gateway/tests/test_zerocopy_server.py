"""ZeroCopy ingress against a real Redis, the real SchedulerLink and a scripted scheduler socket.

The scheduler here is a ROUTER the test drives: it sees the exact frames the gateway puts on the wire
(so "no payload bytes leave the gateway" is measured, not assumed) and answers like the executor
would, reading the client's bytes through its own read-only mapping of the region.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import numpy as np
import pytest
import redis
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anvil_client import AsyncZeroCopyClient, ZeroCopyClient, ZeroCopyError
from anvil_core import codec, keys
from anvil_core.keys import shm_key
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.registry import Registry
from anvil_core.tensors import HostTensor
from anvil_core.zerocopy import Flag, Header, Op, Region, Status
from anvil_core.zerocopy import header as zh
from anvil_core.zerocopy import meta as zm
from anvil_core.zerocopy import slots as slot_io
from anvil_core.zerocopy.region import SHM_DIR
from anvil_gateway.admission import Admission, hash_key
from anvil_gateway.backend import SchedulerLink
from anvil_gateway.discovery import Discovery
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.state import GatewayState
from anvil_gateway.stats import Stats
from anvil_gateway.sysshm import SystemShm
from anvil_gateway.zerocopy_server import ZeroCopyServer

MODELS = {
    "identity": ModelSpec(
        "identity",
        max_batch=8,
        inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
        outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
    )
}
MiB = 1 << 20


class Harness:
    def __init__(self, server: ZeroCopyServer, sched: zmq.asyncio.Socket, redis_url: str) -> None:
        self.server = server
        self.sched = sched
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.wire: list[list[bytes]] = []  # every request group the gateway sent the scheduler
        self.auto = True  # answer like an identity executor
        self.held: asyncio.Queue[tuple[bytes, Any]] = asyncio.Queue()
        self._maps: dict[str, Region] = {}

    async def next_request(self, timeout_s: float = 5.0) -> tuple[bytes, Any]:
        """The next request the gateway sent (when `auto` is off, the test answers it)."""
        return await asyncio.wait_for(self.held.get(), timeout_s)

    def executor_view(self, t: Any) -> np.ndarray:
        """What the executor does: map the announced region read-only, view the span in place."""
        ref = t.shm
        key = ref.region
        if key not in self._maps:
            rec = self.redis.hgetall(shm_key(key))
            self._maps[key] = Region.attach(
                str(rec["name"]), int(rec["slot_bytes"]), int(rec["slot_count"]), writable=False
            )
        region = self._maps[key]
        region.check_span(ref.offset, ref.length)
        shape = tuple(t.shape)
        arr = np.frombuffer(region.get(ref.offset, ref.length), np.float32).reshape(shape)
        assert region.contains(arr)
        return arr

    async def answer(
        self,
        ident: bytes,
        req: Any,
        outputs: dict[str, np.ndarray] | None = None,
        error: tuple[int, str] | None = None,
    ) -> None:
        payloads: list[Any] = []
        tensors = [HostTensor.from_array(n, "FP32", a) for n, a in (outputs or {}).items()]
        env = codec.build_response(
            request_id=req.requestId,
            trace_id=req.traceId,
            model=req.model,
            version="1",
            outputs=codec.tensor_frames(tensors, payloads),
            error=error,
            queue_us=11,
            compute_us=22,
            batch=None if error else codec.BatchTiming(size=1, input_us=3, infer_us=15, output_us=4),
        )
        await self.sched.send_multipart([ident, env, *payloads])

    async def serve(self) -> None:
        while True:
            ident, *parts = await self.sched.recv_multipart()
            for req, group in codec.unbundle(parts):  # the gateway bundles one loop turn's requests
                self.wire.append(group)
                if self.auto:
                    x = self.executor_view(req.inputs[0])
                    await self.answer(ident, req, {"OUTPUT0": x.copy()})
                else:
                    self.held.put_nowait((ident, req))

    def close(self) -> None:
        for region in self._maps.values():
            region.close()
        self.redis.close()


async def _connected(sock: Any, timeout_s: float = 10.0) -> None:
    """Until the link's DEALER has completed its connection: it is ZMQ_IMMEDIATE, so a send before
    that is refused ("scheduler not connected"), which on a loaded machine a test's first request
    could meet (seen in CI: the request never reached the stand-in scheduler)."""
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        if not sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:  # not already connected
            await asyncio.wait_for(mon.recv_multipart(), timeout_s)
    finally:
        sock.disable_monitor()
        mon.close()


@asynccontextmanager
async def gateway(redis_url: str) -> AsyncIterator[Harness]:
    s = GatewaySettings(redis_url=redis_url, heartbeat_interval_ms=100, heartbeat_ttl_ms=1000, slo_p2_ms=2000)
    link = SchedulerLink("gw-zc-test")
    link.start()
    ctx = zmq.asyncio.Context()
    sched = ctx.socket(zmq.ROUTER)
    port = sched.bind_to_random_port("tcp://127.0.0.1")
    link.follow(f"tcp://127.0.0.1:{port}")
    await _connected(link.sock)
    registry = Registry(redis_url, "gateway", "gw-zc-test", 1, 1)
    admission = Admission(require_api_key=False, max_inflight_per_model=4096)
    discovery = Discovery(registry, 1, link.follow, admission.load)
    discovery.models = dict(MODELS)
    st = GatewayState(s, registry, link, discovery, SystemShm(False), admission, Stats())
    link.on_executed = st.stats.executed  # as create_app wires it
    server = ZeroCopyServer(st)
    await server.start()
    h = Harness(server, sched, redis_url)
    task = asyncio.create_task(h.serve())
    try:
        yield h
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop()
        await link.stop()
        await discovery.registry.redis.aclose()
        h.close()
        sched.close()
        ctx.term()


class Raw:
    """A hand-driven client: writes slots and headers itself, so tests can break any rule."""

    live: ClassVar[
        list[Raw]
    ] = []  # closed by `run` even when a test fails midway: no leaked /dev/shm objects

    def __init__(self, endpoint: str, slots: int = 2, slot_bytes: int = 8192) -> None:
        Raw.live.append(self)
        self.region = Region.create(slot_bytes, slots)
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)
        self.region_id = 0

    async def call(self, frame: bytes | list[bytes], timeout_s: float = 5.0) -> tuple[Header, bytes]:
        await (self.sock.send_multipart(frame) if isinstance(frame, list) else self.sock.send(frame))
        return zh.decode_reply(await asyncio.wait_for(self.sock.recv(), timeout_s))

    async def register(
        self, api_key: str = "", name: str = "", slot_bytes: int = 0, count: int = 0
    ) -> Header:
        r = self.region
        payload = slot_io.encode_register(
            slot_bytes or r.slot_bytes, count or r.slot_count, name or r.name, api_key
        )
        head, inline = await self.call(zh.encode(1, Op.REGISTER, len(payload), Flag.INLINE) + payload)
        if head.op == Op.REGISTER_OK:
            self.region_id = head.region
        self.inline = inline.decode()
        return head

    async def registered(self, api_key: str = "") -> int:
        head = await self.register(api_key)
        assert head.op == Op.REGISTER_OK, self.inline
        return head.region

    def write(self, slot: int, rid: int, x: np.ndarray, model: str = "identity", **kw: Any) -> bytes:
        base = self.region.slot_offset(slot)
        block, descs, length = zm.plan(
            lambda d: zm.encode_infer(zm.InferMeta(model, d, **kw)), [("INPUT0", "FP32", x.shape, x.nbytes)]
        )
        self.region.set(base + 16, block)
        self.region.set(base + descs[0].offset, x)
        head = zh.encode(rid, Op.INFER, length, Flag.META, 0, zh.pack_reserved(self.region_id, slot))
        self.region.set(base, head)
        return head

    def slot_text(self, slot: int, head: Header) -> str:
        return bytes(self.region.get(self.region.slot_offset(slot) + 16, head.payload_length)).decode()

    def close(self) -> None:
        if self in Raw.live:
            Raw.live.remove(self)
            self.sock.close()
            self.ctx.term()
            self.region.destroy()


def run(redis_url: str, body: Callable[[Harness], Awaitable[None]]) -> None:
    async def main() -> None:
        async with gateway(redis_url) as h:
            try:
                await body(h)
            finally:
                for raw in list(Raw.live):
                    raw.close()

    asyncio.run(main())


# ---- the request path -----------------------------------------------------------------------
def test_one_mebibyte_crosses_the_gateway_as_a_reference(redis_url: str) -> None:
    """The no-copy proof at the gateway's boundary: the message to the scheduler is one small frame;
    the executor-side view lies inside the region mapping and follows the client's later writes."""

    async def body(h: Harness) -> None:
        h.auto = False
        raw = Raw(h.server.endpoint, slots=2, slot_bytes=2 * MiB)
        await raw.registered()
        x = np.arange(MiB // 4, dtype=np.float32).reshape(1, -1)
        frame = raw.write(1, 77, x)
        await raw.sock.send(frame)
        ident, req = await h.next_request()
        assert len(h.wire[-1]) == 1 and sum(map(len, h.wire[-1])) < 1024  # one envelope, no payload
        t = req.inputs[0]
        assert t.frame == -1 and t.shm.length == MiB
        slot_base = raw.region.slot_offset(1)
        assert slot_base < t.shm.offset < slot_base + raw.region.slot_bytes
        seen = h.executor_view(t)
        assert np.array_equal(seen, x)
        raw.region.set(t.shm.offset, np.array([-1.0], np.float32))  # the client's memory, not a copy
        assert seen[0, 0] == -1.0
        await h.answer(ident, req, {"OUTPUT0": seen * 2})
        head, _ = zh.decode_reply(await raw.sock.recv())
        assert (head.op, head.request_id, head.slot) == (Op.INFER_OK, 77, 1)
        block = zm.read_block(raw.region.get(slot_base + 16, head.payload_length), head.payload_length)
        result = zm.decode_result(block)
        assert (result.queue_us, result.compute_us) == (11, 22)
        (out,) = result.outputs
        got = raw.region.array(slot_base + out.offset, np.dtype(np.float32), out.shape)
        assert got[0, 0] == -2.0 and np.array_equal(got[0, 1:], x[0, 1:] * 2)
        raw.close()

    run(redis_url, body)


def test_clients_round_trip_sync_and_async(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        xs = [np.random.default_rng(i).standard_normal((2, 1000)).astype(np.float32) for i in range(12)]
        async with await AsyncZeroCopyClient.connect(h.server.endpoint, slots=4, slot_bytes=64 << 10) as zc:
            assert await zc.ping() < 1.0
            outs = await asyncio.gather(*(zc.infer("identity", {"INPUT0": x}) for x in xs))
            assert all(np.array_equal(o["OUTPUT0"], x) for o, x in zip(outs, xs, strict=True))
            name = zc.region.name
            assert h.redis.keys(keys.shm_key("*"))
        assert not os.path.exists(os.path.join(SHM_DIR, name))  # close() unlinked it ...
        assert not h.redis.keys(keys.shm_key("*"))  # ... after the gateway withdrew the region

        def sync() -> bool:
            with ZeroCopyClient(h.server.endpoint, slots=1, slot_bytes=64 << 10) as zc:
                return all(np.array_equal(zc.infer("identity", {"INPUT0": x})["OUTPUT0"], x) for x in xs)

        assert await asyncio.to_thread(sync)

    run(redis_url, body)


def test_client_timeout_cancels_and_keeps_the_slot(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        h.auto = False  # the backend never answers the first request
        x = np.ones((1, 4), np.float32)
        async with await AsyncZeroCopyClient.connect(h.server.endpoint, slots=1, timeout_s=0.2) as zc:
            with pytest.raises(ZeroCopyError) as info:
                await zc.infer("identity", {"INPUT0": x})
            assert info.value.status == Status.DEADLINE
            assert zc._free.qsize() == 1  # the CANCEL got its answer: the slot is usable again
            h.auto = True
            ident, req = await h.next_request()  # the abandoned request, answered late: dropped
            await h.answer(ident, req, {"OUTPUT0": x * 7})
            assert np.array_equal((await zc.infer("identity", {"INPUT0": x}))["OUTPUT0"], x)

    run(redis_url, body)


# ---- every rule, and the answer to breaking it ---------------------------------------------------
def test_malformed_doorbells_get_error_headers_and_the_gateway_keeps_serving(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        raw = Raw(h.server.endpoint, slots=2, slot_bytes=4096)
        rid_region = await raw.registered()
        x = np.ones((1, 8), np.float32)
        good = raw.write(0, 9, x)
        cases: list[tuple[bytes | list[bytes], Status, str]] = [
            (b"\x05\x00\x00", Status.BAD_HEADER, "truncated"),
            (zh.HEADER.pack(6, 0x0077, 0, 0, 0), Status.BAD_OP, "unknown op"),
            (zh.HEADER.pack(7, Op.INFER, 4096, Flag.META, rid_region << 16), Status.BAD_LENGTH, "exceeds"),
            (zh.HEADER.pack(8, Op.INFER, 64, Flag.META, rid_region << 16 | 2), Status.BAD_SLOT, "slot 2"),
            (zh.HEADER.pack(10, Op.INFER, 64, Flag.META, 999 << 16), Status.BAD_REGION, "not registered"),
            (zh.HEADER.pack(11, Op.INFER, 64, Flag.META, rid_region << 16 | 1), Status.BAD_SLOT, "differs"),
            ([good, good], Status.BAD_HEADER, "one frame"),
        ]
        for frame, status, says in cases:
            head, inline = await raw.call(frame)
            text = inline.decode() if head.flags & Flag.INLINE else raw.slot_text(1, head)
            assert (head.op, head.status) == (Op.ERROR, status), text
            assert says in text
        assert not h.wire  # nothing reached the scheduler
        head, _ = await raw.call(good)
        assert head.op == Op.INFER_OK
        raw.close()

    run(redis_url, body)


@pytest.mark.parametrize(
    ("kw", "x", "status", "says"),
    [
        ({"model": "nope"}, np.ones((1, 4), np.float32), Status.NOT_FOUND, "unknown model 'nope'"),
        ({}, np.ones((1, 2, 2), np.float32), Status.BAD_REQUEST, "does not match"),
        ({}, np.ones((9, 4), np.float32), Status.BAD_REQUEST, "batch dimension 9"),
        ({"outputs": ("NOPE",)}, np.ones((1, 4), np.float32), Status.BAD_REQUEST, "no outputs ['NOPE']"),
        ({"model_version": "7"}, np.ones((1, 4), np.float32), Status.NOT_FOUND, "no version '7'"),
    ],
)
def test_requests_that_do_not_fit_the_model_are_refused_in_the_slot(
    redis_url: str, kw: dict[str, Any], x: np.ndarray, status: Status, says: str
) -> None:
    async def body(h: Harness) -> None:
        raw = Raw(h.server.endpoint)
        await raw.registered()
        head, _ = await raw.call(raw.write(0, 3, x, **kw))
        assert (head.op, head.status, head.request_id) == (Op.ERROR, status, 3)
        assert not head.flags & Flag.INLINE and says in raw.slot_text(0, head)
        assert not h.wire
        raw.close()

    run(redis_url, body)


def test_register_refusals_never_echo_the_name(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        raw = Raw(h.server.endpoint, slots=2, slot_bytes=4096)
        name = raw.region.name
        cases = [
            (4096, 2, "../../etc/passwd", "must match"),
            (4096, 2, "anvil-x/../../y", "must match"),
            (4096, 2, name, "mode 0600"),
            (4096, 4, name, "declared layout needs"),
            (2048, 2, name, "does not match the declared layout"),
        ]
        for slot_bytes, count, who, says in cases:
            os.chmod(os.path.join(SHM_DIR, name), 0o644 if says == "mode 0600" else 0o600)
            head = await raw.register(name=who, slot_bytes=slot_bytes, count=count)
            assert (head.op, head.status) == (Op.ERROR, Status.BAD_REGION) and says in raw.inline
            assert name not in raw.inline
        await raw.registered()
        head = await raw.register()
        assert head.status == Status.BAD_REGION and "already registered" in raw.inline
        raw.close()

    run(redis_url, body)


def test_api_key_sets_the_tenant_and_admission_applies(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        admission = h.server.st.admission
        admission.load({"acme:2": '{"rate_rps": 0.001, "burst": 1}'}, {hash_key("k-acme"): "acme"})
        raw = Raw(h.server.endpoint)
        await raw.registered(api_key="k-acme")
        x = np.ones((1, 4), np.float32)
        head, _ = await raw.call(raw.write(0, 1, x))
        assert head.op == Op.INFER_OK  # the burst of 1
        head, _ = await raw.call(raw.write(0, 2, x))
        assert head.status == Status.OVERLOAD and "over its rate" in raw.slot_text(0, head)
        assert admission.inflight["identity"] == 0  # every admitted request was released
        stats = h.server.st.stats.models[("identity", "1")]
        assert (stats.inference_count, stats.execution_count) == (1, 1)
        admission.require_api_key = True  # the HTTP rules: a known key is then required
        other = Raw(h.server.endpoint)
        head = await other.register(api_key="wrong")
        assert (head.status, other.inline) == (Status.UNAUTHORIZED, "unknown API key (REGISTER payload)")
        assert (await other.register()).status == Status.UNAUTHORIZED
        other.close()
        raw.close()

    run(redis_url, body)


def test_busy_slot_and_duplicate_id_are_refused_without_touching_the_slot(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        h.auto = False
        raw = Raw(h.server.endpoint, slots=2)
        await raw.registered()
        await raw.sock.send(raw.write(0, 5, np.ones((1, 4), np.float32)))
        ident, req = await h.next_request()
        before = bytes(raw.region.get(raw.region.slot_offset(0), 256))
        head, _ = await raw.call(zh.HEADER.pack(6, Op.INFER, 100, Flag.META, raw.region_id << 16))
        assert head.status == Status.SLOT_BUSY and head.flags & Flag.INLINE
        head, _ = await raw.call(raw.write(1, 5, np.ones((1, 4), np.float32)))
        assert head.status == Status.DUPLICATE
        assert bytes(raw.region.get(raw.region.slot_offset(0), 256)) == before
        await h.answer(ident, req, {"OUTPUT0": np.zeros((1, 4), np.float32)})
        head, _ = zh.decode_reply(await raw.sock.recv())
        assert (head.op, head.request_id) == (Op.INFER_OK, 5)
        raw.close()

    run(redis_url, body)


# ---- lifecycle: cancel, unregister, deadlines, errors from behind -------------------------------
def test_cancel_answers_once_and_ignores_the_late_result(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        h.auto = False
        raw = Raw(h.server.endpoint)
        await raw.registered()
        await raw.sock.send(raw.write(0, 40, np.ones((1, 4), np.float32)))
        ident, req = await h.next_request()
        await raw.sock.send(zh.encode(41, Op.CANCEL, reserved=40))
        first, _ = zh.decode_reply(await raw.sock.recv())
        second, _ = zh.decode_reply(await raw.sock.recv())
        assert (first.request_id, first.op, first.status) == (40, Op.ERROR, Status.CANCELLED)
        assert (second.request_id, second.op) == (41, Op.CANCEL_OK)
        slot = bytes(raw.region.get(0, raw.region.size))
        await h.answer(ident, req, {"OUTPUT0": np.full((1, 4), 5, np.float32)})  # late
        head, _ = await raw.call(zh.encode(42, Op.PING))
        assert head.op == Op.PONG  # and nothing else came in between
        assert bytes(raw.region.get(0, raw.region.size)) == slot  # the late result was not written
        head, inline = await raw.call(zh.encode(43, Op.CANCEL, reserved=40))
        assert (head.op, head.status) == (Op.ERROR, Status.NOT_FOUND) and b"not in flight" in inline
        raw.close()

    run(redis_url, body)


def test_unregister_waits_for_requests_in_flight(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        h.auto = False
        raw = Raw(h.server.endpoint)
        await raw.registered()
        await raw.sock.send(raw.write(0, 1, np.ones((1, 4), np.float32)))
        ident, req = await h.next_request()
        await raw.sock.send(zh.encode(2, Op.UNREGISTER, reserved=raw.region_id << 16))
        head, _ = await raw.call(raw.write(1, 3, np.ones((1, 4), np.float32)))
        assert (head.request_id, head.status) == (3, Status.BAD_REGION)  # closing: no new work
        assert h.redis.keys(keys.shm_key("*"))  # still announced: the executor may need it
        await h.answer(ident, req, {"OUTPUT0": np.ones((1, 4), np.float32)})
        done, _ = zh.decode_reply(await raw.sock.recv())
        gone, _ = zh.decode_reply(await raw.sock.recv())
        assert (done.op, done.request_id, gone.op, gone.request_id) == (Op.INFER_OK, 1, Op.UNREGISTER_OK, 2)
        assert not h.redis.keys(keys.shm_key("*"))
        raw.close()

    run(redis_url, body)


def test_deadline_backend_error_and_oversized_results(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        h.auto = False
        raw = Raw(h.server.endpoint, slots=1, slot_bytes=1024)
        await raw.registered()
        head, _ = await raw.call(raw.write(0, 1, np.ones((1, 4), np.float32), timeout_us=50_000), 2)
        assert (head.status, "deadline (50 ms)" in raw.slot_text(0, head)) == (Status.DEADLINE, True)
        await h.next_request()
        await raw.sock.send(raw.write(0, 2, np.ones((1, 4), np.float32)))
        ident, req = await h.next_request()
        await h.answer(ident, req, error=(4, "shed: queue too deep"))
        head, _ = zh.decode_reply(await raw.sock.recv())
        assert head.status == Status.DEADLINE and raw.slot_text(0, head) == "deadline: shed: queue too deep"
        await raw.sock.send(raw.write(0, 3, np.ones((1, 4), np.float32)))
        ident, req = await h.next_request()
        await h.answer(ident, req, {"OUTPUT0": np.ones((1, 1000), np.float32)})
        head, _ = zh.decode_reply(await raw.sock.recv())
        assert head.status == Status.TOO_LARGE and "the slot holds 1024" in raw.slot_text(0, head)
        raw.close()

    run(redis_url, body)


def test_a_region_its_owner_unlinked_is_withdrawn(redis_url: str) -> None:
    async def body(h: Harness) -> None:
        raw = Raw(h.server.endpoint)
        await raw.registered()
        os.unlink(os.path.join(SHM_DIR, raw.region.name))
        for _ in range(50):
            if not h.redis.keys(keys.shm_key("*")):
                break
            await asyncio.sleep(0.05)
        assert not h.redis.keys(keys.shm_key("*"))
        head, _ = await raw.call(raw.write(0, 1, np.ones((1, 4), np.float32)))
        assert head.status == Status.BAD_REGION
        raw.region.owner = False  # already unlinked
        raw.close()

    run(redis_url, body)


def test_random_doorbells_are_all_answered_with_errors(redis_url: str) -> None:
    """Hypothesis over the real socket: any frame gets exactly one ERROR; the server survives."""

    async def body(h: Harness) -> None:
        raw = Raw(h.server.endpoint)
        region = await raw.registered()
        frames: list[bytes] = []

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            st.one_of(
                st.binary(min_size=1, max_size=40),
                st.builds(
                    lambda op, ln, fl, slot: zh.HEADER.pack(1, op, ln, fl, region << 16 | slot),
                    st.sampled_from([1, 2, 3, 4, 5, 0x8003, 0xFFFF, 0x1234]),
                    st.integers(0, 1 << 20),
                    st.integers(0, 0xFFFF),
                    st.integers(0, 4),
                ),
            )
        )
        def collect(frame: bytes) -> None:
            frames.append(frame)

        collect()
        for frame in frames:
            if len(frame) >= zh.HEADER_BYTES and zh.HEADER.unpack_from(frame)[1] in (
                Op.UNREGISTER,
                Op.REGISTER,
            ):
                continue  # valid ops that would change the region under test
            head, _ = await raw.call(frame)
            assert head.op in (Op.ERROR, Op.PONG)
        head, _ = await raw.call(raw.write(0, 1, np.ones((1, 4), np.float32)))
        assert head.op == Op.INFER_OK
        raw.close()

    run(redis_url, body)
