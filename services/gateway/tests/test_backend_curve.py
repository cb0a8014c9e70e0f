"""The gateway's link to the scheduler under CURVE (issue #18): it talks only to the server that
holds the scheduler's key. An impostor scheduler (another key, or no CURVE) gets nothing, and the
caller gets an explicit error."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from anvil_core import codec
from anvil_core.curve import CurveClient, CurveServer
from anvil_core.zmq_auth import CurveGate
from anvil_core.zmq_sockets import make_socket
from anvil_gateway.backend import BackendUnavailable, SchedulerLink


def _request(rid: str) -> list[bytes]:
    env = codec.build_request(
        request_id=rid, trace_id="t", model="m", version="1", priority=2, deadline_unix_ns=2**62, tenant=""
    )
    return [env, b"payload"]


@pytest.mark.parametrize("server", ["the real scheduler", "another key", "no curve"])
def test_the_link_reaches_only_the_scheduler_holding_the_key(server: str) -> None:
    real_pub, real_sec = zmq.curve_keypair()
    gw_pub, gw_sec = zmq.curve_keypair()

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        gate = CurveGate(zmq.Context.shadow(ctx.underlying), "fake", {"gateway": frozenset({gw_pub})})
        gate.start()  # the impostor even admits the gateway's key: the server key is what fails
        curve = {
            "the real scheduler": CurveServer(real_sec, "gateway"),
            "another key": CurveServer(zmq.curve_keypair()[1], "gateway"),
            "no curve": None,
        }[server]
        router = make_socket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:0", curve=curve)
        link = SchedulerLink("gw-test", curve=CurveClient(gw_sec, real_pub))
        link.follow(router.getsockopt(zmq.LAST_ENDPOINT).decode())
        link.start()
        try:
            if server == "the real scheduler":
                # immediate=True: a request fails at once until the handshake completes; try again
                for i in range(200):
                    call = asyncio.ensure_future(link.infer(f"r{i}", _request(f"r{i}"), 10))
                    if await router.poll(50):
                        break
                _ident, *parts = await router.recv_multipart()
                body, _group = codec.unbundle(parts)[0]
                assert body.requestId.startswith("r")
                call.cancel()
                return
            # the handshake never completes: nothing is queued and every request fails at once; the
            # impostor receives not one message, before or after the link saw the handshake fail
            i, after = 0, 0
            while after < 20:
                i += 1
                with pytest.raises(BackendUnavailable, match="not connected"):
                    await link.infer(f"r{i}", _request(f"r{i}"), 1)
                assert i < 1000, "the link never saw its handshake fail"
                after += link.handshakes.refusals > 0
                assert await router.poll(10) == 0  # also gives the I/O thread its turn
        finally:
            await link.stop()
            router.close()
            gate.stop()
            ctx.term()

    asyncio.run(main())
