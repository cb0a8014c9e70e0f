"""An Executor with ANVIL_LINK_TRANSPORT=unix against a real UnixRouter (the scheduler's side): it
registers over the Unix link, runs batches and answers them there, and after the scheduler's
socket goes away and comes back it reconnects and registers again by itself."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.unix_link import UnixRouter, unix_endpoint, unix_path
from anvil_executor.service import Executor

sys.path.insert(0, str(Path(__file__).parent))
from wire_helpers import batch_frames, executor_settings


def _next(router: UnixRouter, want: type, timeout_s: float = 20) -> tuple[bytes, Any, list[Any]]:
    """The next message of type ``want`` from any peer (heartbeats and others skipped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        poller = zmq.Poller()
        for fd, wants_write in router.fds():
            poller.register(fd, zmq.POLLIN | (zmq.POLLOUT if wants_write else 0))
        for fd, flags in poller.poll(50):
            msgs, _ = router.on_ready(fd, bool(flags & zmq.POLLOUT))
            for ident, parts in msgs:
                body, frames = codec.unpack(parts)  # what the executor sends must always verify
                if isinstance(body, want):
                    return ident, body, frames
    raise AssertionError(f"no {want.__name__} within {timeout_s} s")


def test_an_executor_serves_over_the_unix_link_and_registers_again_after_the_scheduler_returns(
    redis_url: str, tmp_path: Path
) -> None:
    links = tmp_path / "links"
    links.mkdir(mode=0o700)
    endpoint = unix_endpoint(str(links), "executor")
    settings = executor_settings(
        redis_url, tmp_path, "ex-unix", link_ipc_dir=str(links), link_transport="unix"
    )
    router = UnixRouter(unix_path(endpoint))
    ex = Executor(settings)
    assert ex.link is not None
    ex._follow(endpoint)
    stop = threading.Event()
    loop = threading.Thread(target=ex.run, args=(stop,), name="io-loop", daemon=True)
    loop.start()
    try:
        ident, reg, _ = _next(router, pb.RegisterT)
        assert ident == b"ex-unix" and reg.serviceId == "ex-unix"
        assert router.send(ident, batch_frames("b1", ["r1", "r2"]))
        _, result, frames = _next(router, pb.BatchResultT)
        assert result.batchId == "b1" and result.error is None
        groups = codec.split_groups(frames, result.frameCounts)
        outs = [codec.request_tensor(codec.read_response(g[0]).outputs[0], g[1:]).data for g in groups]
        assert [float(o[0, 0]) for o in outs] == [0.0, 1.0] and all(o.shape == (1, 4) for o in outs)
        assert all(np.isfinite(o).all() for o in outs)

        router.close()  # the scheduler dies; a new one binds the same path
        router = UnixRouter(unix_path(endpoint))
        ident, reg, _ = _next(router, pb.RegisterT)  # reconnected and registered, unasked
        assert ident == b"ex-unix" and ex.link.connects >= 2
        assert router.send(ident, batch_frames("b2", ["r3"]))
        _, result, _ = _next(router, pb.BatchResultT)
        assert result.batchId == "b2" and result.error is None
    finally:
        stop.set()
        loop.join(10)
        router.close()
