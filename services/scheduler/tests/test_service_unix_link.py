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
        _close(s, dealer)


def _request(rid: str) -> Any:
    return codec.build_request(
        request_id=rid, trace_id="t", model="m", version="", priority=2,
        deadline_unix_ns=time.time_ns() + 10**10, tenant="",
    )  # fmt: skip


def _direct_stack(tmp_path: Path, direct: bool) -> tuple[Scheduler, zmq.Poller, UnixDealer, UnixDealer]:
    links = tmp_path / "links"
    settings = SchedulerSettings(
        gateway_port=0, executor_port=0, link_bind_host="127.0.0.1", zmq_curve=False,
        link_ipc_dir=str(links), direct_answers=direct,
    )  # fmt: skip
    s = Scheduler(settings)
    poller = zmq.Poller()
    ex = UnixDealer("ex-1", retry_s=0.01)
    gw = UnixDealer("gw-1", retry_s=0.01)  # a gateway on the Unix link, named by its hello
    ex.follow(unix_endpoint(str(links), "executor"))
    gw.follow(unix_endpoint(str(links), "gateway"))
    ex.send(_register("ex-1"))
    assert s.links is not None
    links_ = s.links
    _until(s, poller, lambda: "ex-1" in s.executors and b"gw-1" in links_.gateway.conns)
    return s, poller, ex, gw


def _close(s: Scheduler, *dealers: UnixDealer) -> None:
    for d in dealers:
        d.close()
    if s.links is not None:
        s.links.close()
    s.gw.close()
    s.ex.close()
    s.ctx.term()
    s.bg.stop()


def test_a_batch_names_the_unix_gateways_and_answers_delivered_directly_are_not_forwarded(
    tmp_path: Path,
) -> None:
    """Direct answers: the batch names each request's gateway where that gateway is on the Unix
    link ("" for one over ZeroMQ); the executor's result lists what it delivered itself, which the
    scheduler counts answered and does not forward; a request neither delivered nor in a group still
    gets its error."""
    s, poller, ex, gw = _direct_stack(tmp_path, direct=True)
    try:
        sent: list[tuple[bytes, list[Any]]] = []
        real_send = s._send_to
        s._send_to = lambda g, parts: (sent.append((g, parts)), real_send(g, parts))  # type: ignore[method-assign]
        gw.send(codec.bundle([[_request("r1")], [_request("r2")]], responses=False))
        s.handle(s._on_gateway, [b"gw-zmq", _request("r3")])  # a gateway over ZeroMQ
        got: list[Any] = []
        _until(s, poller, lambda: bool(got.extend(ex.read()) or got))
        body, frames = codec.unpack(got[0])
        assert isinstance(body, pb.BatchT)
        ids = [codec.read_request(g[0]).requestId for g in codec.split_groups(frames, body.frameCounts)]
        assert list(body.replyTo) == ["gw-1" if rid in ("r1", "r2") else "" for rid in ids]
        result = pb.BatchResultT(batchId=body.batchId, executorId="ex-1", computeUs=100)
        answer = codec.build_response(request_id="r3", trace_id="t", model="m", outputs=[])
        result.frameCounts = [1]  # r3 through the scheduler, r1 delivered, r2 neither
        result.deliveredIds = ["r1"]
        ex.send(codec.pack(result, [answer]))
        _until(s, poller, lambda: not s.core.pool.in_flight("ex-1"))
        to = {g: [codec.read_response(p[0]) for p in [parts]] for g, parts in sent}
        assert set(to) == {b"gw-zmq", b"gw-1"}
        assert to[b"gw-zmq"][0].requestId == "r3" and to[b"gw-zmq"][0].error is None
        r2 = to[b"gw-1"][0]  # r2's error, and nothing for r1
        assert r2.requestId == "r2" and r2.error is not None and "no result" in (r2.error.reason or "")
        assert len(sent) == 2
    finally:
        _close(s, ex, gw)


def test_without_direct_answers_a_batch_names_no_gateway(tmp_path: Path) -> None:
    s, poller, ex, gw = _direct_stack(tmp_path, direct=False)
    try:
        gw.send([_request("r1")])
        got: list[Any] = []
        _until(s, poller, lambda: bool(got.extend(ex.read()) or got))
        body, _ = codec.unpack(got[0])
        assert isinstance(body, pb.BatchT) and not body.replyTo
    finally:
        _close(s, ex, gw)
