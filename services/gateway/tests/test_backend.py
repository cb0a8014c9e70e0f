"""SchedulerLink against a real ROUTER socket: requests of one loop turn travel as bundles."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq
import zmq.asyncio

from anvil_core import codec
from anvil_core.tensors import HostTensor
from anvil_gateway.backend import BackendUnavailable, SchedulerLink


def _request(rid: str) -> list[bytes]:
    env = codec.build_request(
        request_id=rid, trace_id="t", model="m", version="1", priority=2, deadline_unix_ns=2**62, tenant=""
    )
    return [env, rid.encode() * 3]  # an envelope and one payload frame


def _response(rid: bytes) -> list[bytes]:
    """An answer with one UINT8 output in one payload frame."""
    out = HostTensor.from_buffer("o", "UINT8", (4 + len(rid),), b"out-" + rid)
    env = codec.build_response(request_id=rid, trace_id="t", model="m", compute_us=7, outputs=[(out, 0)])
    return [env, b"out-" + rid]


@pytest.mark.parametrize(
    ("bundle_max", "urgent", "sizes"),
    [(8, (), [5]), (2, (), [2, 2, 1]), (1, (), [1, 1, 1, 1, 1]), (8, (2,), [3, 2]), (2, (0, 4), [1, 2, 2])],
)
def test_one_turn_of_requests_leaves_in_bundles_and_answers_find_their_callers(
    bundle_max: int, urgent: tuple[int, ...], sizes: list[int]
) -> None:
    """Bundles close when full, when an urgent (priority 1) request joins, and at the turn's end."""

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = SchedulerLink("gw-test", bundle_max=bundle_max)
        monitor = link.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        link.follow(f"tcp://127.0.0.1:{port}")
        link.start()
        try:
            await asyncio.wait_for(monitor.recv_multipart(), 5)  # immediate=True: no send before this
            link.sock.disable_monitor()
            rids = [f"r{i}" for i in range(5)]
            calls = [
                asyncio.ensure_future(link.infer(rid, _request(rid), 5, urgent=i in urgent))
                for i, rid in enumerate(rids)
            ]
            got: list[list[str]] = []
            while sum(map(len, got)) < len(rids):
                ident, *parts = await asyncio.wait_for(router.recv_multipart(), 5)
                groups = codec.unbundle(parts)
                got.append([body.requestId for body, _ in groups])
                assert all(len(g) == 2 and g[1] == body.requestId.encode() * 3 for body, g in groups)
            assert [len(b) for b in got] == sizes
            assert [rid for b in got for rid in b] == rids  # in call order
            # answer all five in one BatchResult bundle, in reverse order
            reply = codec.bundle([_response(r.encode()) for r in reversed(rids)], responses=True)
            await router.send_multipart([ident, *reply])
            for rid, call in zip(rids, calls, strict=True):
                resp, frames = await asyncio.wait_for(call, 5)
                assert resp.requestId == rid and resp.computeUs == 7
                assert [bytes(f) for f in frames] == [b"out-" + rid.encode()]
            assert not link.pending
        finally:
            monitor.close()  # before the context ends: an open monitor socket blocks ctx.term()
            await link.stop()
            router.close()
            ctx.term()

    asyncio.run(main())


def test_a_bundle_that_cannot_leave_fails_each_of_its_callers() -> None:
    async def main() -> list[BaseException]:
        link = SchedulerLink("gw-test")
        link.follow("tcp://127.0.0.1:9")  # nothing listens: with immediate=True a send is refused
        link.start()
        try:
            calls = [link.infer(f"r{i}", _request(f"r{i}"), 5) for i in range(3)]
            out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
            assert not link.pending
            return [e for e in out if isinstance(e, BaseException)]
        finally:
            await link.stop()

    errors = asyncio.run(main())
    assert len(errors) == 3
    assert all(isinstance(e, BackendUnavailable) and "not connected" in str(e) for e in errors)


def test_no_scheduler_is_refused_at_once() -> None:
    async def main() -> None:
        link = SchedulerLink("gw-test")
        with pytest.raises(BackendUnavailable, match="no scheduler"):
            await link.infer("r", _request("r"), 1)

    asyncio.run(main())


def test_stopping_with_requests_not_yet_sent_answers_them() -> None:
    async def main() -> tuple[list[BaseException], list[dict[str, Any]]]:
        loop_errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        link = SchedulerLink("gw-test")
        link.follow("tcp://127.0.0.1:9")
        link.start()
        calls = [asyncio.ensure_future(link.infer(f"r{i}", _request(f"r{i}"), 5)) for i in range(3)]
        await asyncio.sleep(0)  # the calls queue their requests; the flush comes at the turn's end
        assert len(link._outbox) == 3
        await link.stop()
        out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        for _ in range(3):
            await asyncio.sleep(0)  # any flush still scheduled runs (and must not raise)
        return [e for e in out if isinstance(e, BaseException)], loop_errors

    errors, loop_errors = asyncio.run(main())
    assert len(errors) == 3 and all(isinstance(e, BackendUnavailable) for e in errors)
    assert not loop_errors


# ---- issue #18: a bad message from the scheduler never ends the receive loop ----------------------
def _garbage_messages() -> list[list[bytes]]:
    good = _response(b"x")[0]
    bad_counts = codec.bundle([_response(b"a"), _response(b"b")], responses=True)[:-1]
    non_utf8 = codec.build_response(request_id=b"\xff\xfe", trace_id="t", model="m")
    return [[b"\x00"], [good[:9]], [bytes(range(200))], bad_counts, [non_utf8], [b""]]


def test_crafted_messages_from_the_scheduler_are_dropped_and_the_loop_keeps_answering() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = SchedulerLink("gw-test", bundle_max=1)
        monitor = link.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        link.follow(f"tcp://127.0.0.1:{port}")
        link.start()
        try:
            await asyncio.wait_for(monitor.recv_multipart(), 5)  # immediate=True: no send before this
            link.sock.disable_monitor()
            monitor.close()
            call = asyncio.ensure_future(link.infer("r0", _request("r0"), 5))
            ident, *_ = await asyncio.wait_for(router.recv_multipart(), 5)
            for msg in _garbage_messages():
                await router.send_multipart([ident, *msg])
            await router.send_multipart([ident, *_response(b"r0")])
            resp, _frames = await asyncio.wait_for(call, 5)
            assert resp.requestId == "r0"
            assert link.alive and link.died is None
            assert sum(link.drops.counts.values()) == len(_garbage_messages())
        finally:
            await link.stop()
            router.close()
            ctx.term()

    asyncio.run(main())


def test_a_response_whose_fields_do_not_read_fails_its_caller_only() -> None:
    async def main() -> None:
        link = SchedulerLink("gw-test")
        loop = asyncio.get_running_loop()
        ok, bad = loop.create_future(), loop.create_future()
        link.pending.update({"ok": ok, "bad": bad})
        y = HostTensor.from_buffer("y", "FP32", (1,), b"\x00" * 4)
        # "bad" names output frame 5 but carries none; "ok" is intact
        bad_env = codec.build_response(request_id="bad", trace_id="t", model="m", outputs=[(y, 5)])
        good_env = codec.build_response(request_id="ok", trace_id="t", model="m", outputs=[(y, 0)])
        link.on_message(codec.bundle([[bad_env], [good_env, b"\x00" * 4]], responses=True))
        assert ok.result()[0].requestId == "ok"
        with pytest.raises(BackendUnavailable, match="malformed answer"):
            bad.result()
        assert link.drops.counts == {"invalid": 1}
        await link.stop()

    asyncio.run(main())


def test_when_the_receive_loop_dies_it_says_so_and_fails_waiting_callers() -> None:
    async def main() -> None:
        link = SchedulerLink("gw-test")
        link.follow("tcp://127.0.0.1:9")

        async def broken() -> None:
            raise RuntimeError("boom")

        link._rx_loop = broken  # type: ignore[method-assign]
        link.start()
        waiting = asyncio.get_running_loop().create_future()
        link.pending["w"] = waiting
        await asyncio.gather(link._rx, return_exceptions=True)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the done callback runs
        assert not link.alive and link.died is not None and "boom" in link.died
        with pytest.raises(BackendUnavailable, match="receive loop ended"):
            await waiting
        await link.stop()

    asyncio.run(main())


def test_readiness_is_red_once_the_receive_loop_has_died() -> None:
    from types import SimpleNamespace

    from anvil_gateway.routes_meta import ready

    class Discovery:
        async def ready(self) -> tuple[bool, str]:
            return True, ""

    link = SchedulerLink("gw-test")
    request = SimpleNamespace(
        app=SimpleNamespace(state=SimpleNamespace(gw=SimpleNamespace(link=link, discovery=Discovery())))
    )
    assert asyncio.run(ready(request)).status_code == 200  # type: ignore[arg-type]
    link.died = "scheduler receive loop ended: RuntimeError: boom"
    resp = asyncio.run(ready(request))  # type: ignore[arg-type]
    assert resp.status_code == 503 and b"receive loop ended" in resp.body
