"""The scheduler over its same-host Unix links (anvil_core.unix_link): an executor registers there,
receives its batch there, and when its link ends (kill -9) it is lost at once, its batch re-queued,
not after `executor_timeout_ms` without a heartbeat."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.unix_link import UnixDealer, unix_endpoint
from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings


def _turn(s: Scheduler, poller: zmq.Poller) -> None:
    """One turn of the scheduler's loop over its Unix links (run() without the ZeroMQ sockets)."""
    assert s.links is not None
    s.links.watch(poller)
    events = dict(poller.poll(20))
    s.links.serve(events, s._from_gateway, s._from_executor, s._link_problem)
    now = time.monotonic()
    s._chores(now)
    s._poll_core(now)


def _until(s: Scheduler, poller: zmq.Poller, cond: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        _turn(s, poller)


def _register(eid: str) -> list[Any]:
    reg = pb.RegisterT()
    reg.kind = pb.ServiceKind.EXECUTOR
    reg.serviceId = eid
    reg.device = "cpu"
    reg.maxBatch = 8
    reg.credits = 2
    spec = pb.ModelSpecT()
    spec.name, spec.version, spec.maxBatch = "m", "1", 8
    reg.models = [spec]
    return codec.pack(reg)


def test_an_executor_on_the_unix_link_is_lost_as_soon_as_its_link_ends(tmp_path: Path) -> None:
    links = tmp_path / "links"
    settings = SchedulerSettings(
        gateway_port=0, executor_port=0, link_bind_host="127.0.0.1", zmq_curve=False, link_ipc_dir=str(links)
    )
    s = Scheduler(settings)
    poller = zmq.Poller()
    dealer = UnixDealer("ex-1", retry_s=0.01)
    try:
        assert links.stat().st_mode & 0o777 == 0o700
        dealer.follow(unix_endpoint(str(links), "executor"))
        dealer.send(_register("ex-1"))
        _until(s, poller, lambda: "ex-1" in s.executors)
        assert s.executors["ex-1"] == b"ex-1"
        # a request arrives from a gateway (answers to it are recorded, not sent)
        replies: list[Any] = []
        s._send_to = lambda gw, parts: replies.append(parts)  # type: ignore[method-assign]
        x = codec.build_request(
            request_id="r1", trace_id="t", model="m", version="", priority=2,
            deadline_unix_ns=time.time_ns() + 10**10, tenant="",
        )  # fmt: skip
        s.handle(s._on_gateway, [b"gw-1", x])
        got: list[Any] = []
        _until(s, poller, lambda: bool(got.extend(dealer.read()) or got))
        body, _ = codec.unpack(got[0])
        assert isinstance(body, pb.BatchT) and body.model == "m"
        assert s.core.pool.in_flight("ex-1")
        t0 = time.monotonic()
        dealer.close()  # kill -9: the socket closes with the process
        _until(s, poller, lambda: "ex-1" not in s.executors)
        lost_after = time.monotonic() - t0
        assert lost_after < settings.executor_timeout_ms / 1000 / 2, lost_after
        assert not s.core.pool.in_flight("ex-1")
    finally:
        dealer.close()
        if s.links is not None:
            s.links.close()
        s.gw.close()
        s.ex.close()
        s.ctx.term()
        s.bg.stop()
