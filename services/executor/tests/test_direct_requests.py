"""Direct requests on the executor (service.py `_on_direct`, peer_links.py `DirectSocket`;
docs/scheduler.md "Direct requests"): a gateway's lone request on the executor's direct socket runs
on the I/O loop when the inline rule holds (idle, a model measured fast) and is answered on that
connection; otherwise it is handed back with ``[BUSY, request id]``. A request whose envelope names
another model than its header is refused by the batch runner; a message without its header is
dropped; the executor keeps serving. A real Executor on its own loop thread, a stand-in scheduler's
ROUTER, a plain socket as the gateway."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.unix_link import HELLO, FrameReader, encode
from anvil_core.unix_peers import BUSY, direct_path

sys.path.insert(0, str(Path(__file__).parent))
from test_inline import Recorder, _ok, _running
from wire_helpers import batch_frames, result_of


class Gateway:
    """A gateway's end of a direct connection: a blocking socket, hello first."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(path)
        self.reader = FrameReader()
        self.got: list[list[bytes]] = []
        self.send([HELLO, b"gw-test"])

    def send(self, parts: list[bytes]) -> None:
        self.sock.sendall(b"".join(bytes(b) for b in encode(parts)))

    def request(self, model: str, rid: str, envelope_model: str | None = None) -> None:
        frames = batch_frames("unused", [rid], model=envelope_model or model)[1:]  # one request's group
        self.send([model.encode(), rid.encode(), *frames])

    def next(self) -> list[bytes]:
        while not self.got:
            data = self.sock.recv(1 << 20)
            assert data, "the executor closed the direct connection"
            self.got += self.reader.feed(data)
        return self.got.pop(0)

    def close(self) -> None:
        self.sock.close()


def _answer(parts: list[bytes]) -> tuple[Any, list[Any]]:
    ((body, group),) = codec.unbundle(parts)
    assert isinstance(body, pb.InferResponseT)
    return body, group[1:]


def _serving(r: Any, tmp_path: Path) -> Gateway:
    r.ex.direct.listen(str(tmp_path))
    path = direct_path(str(tmp_path), r.ex.s.service_id)
    assert path is not None and r.ex.direct.path == path
    return Gateway(path)


def test_a_lone_direct_request_runs_on_the_io_loop_and_is_answered_on_its_connection(
    redis_url: str, tmp_path: Path
) -> None:
    fast = Recorder("fast")
    with _running(redis_url, tmp_path, {"fast": fast}) as r:
        gw = _serving(r, tmp_path)
        try:
            gw.request("fast", "d0")  # never measured: handed back, the scheduler's batch measures it
            assert gw.next() == [BUSY, b"d0"]
            r.send("1", ["a"], "fast")
            _ok(*result_of(r.router, "1"), 0.0)
            r.ex._compute_s["fast"] = 1e-4  # measured fast (a cold first run can take longer)
            gw.request("fast", "d1")
            body, payloads = _answer(gw.next())
            assert body.requestId == "d1" and body.error is None
            out = codec.request_tensor(body.outputs[0], payloads).data
            assert np.array_equal(out, np.zeros((1, 4), np.float32))
            assert fast.ran_on[-1] == "io-loop" and r.ex.direct.ran == 1
            # the per-hop stamps: its receipt stands for the dispatch, no scheduler queue
            assert body.queueUs == 0 and body.dispatchedUnixNs == body.executorInUnixNs > 0
        finally:
            gw.close()


def test_a_direct_request_that_finds_the_executor_busy_is_handed_back(redis_url: str, tmp_path: Path) -> None:
    fast, slow = Recorder("fast"), Recorder("slow")
    with _running(redis_url, tmp_path, {"fast": fast, "slow": slow}) as r:
        gw = _serving(r, tmp_path)
        try:
            r.send("1", ["a"], "fast")
            _ok(*result_of(r.router, "1"), 0.0)
            r.ex._compute_s["fast"] = 1e-4  # measured fast (a cold first run can take longer)
            slow.release.clear()  # a scheduler's batch holds the compute thread
            r.send("2", ["a"], "slow")
            assert slow.running.wait(20)
            gw.request("fast", "d1")
            assert gw.next() == [BUSY, b"d1"]
            gw.request("nope", "d2")  # not a model of this executor
            assert gw.next() == [BUSY, b"d2"]
            slow.release.set()
            _ok(*result_of(r.router, "2"), 0.0)
            assert fast.ran_on == ["compute-0"] and r.ex.direct.ran == 0
        finally:
            slow.release.set()
            gw.close()


@pytest.mark.parametrize("bad", ["header only", "other model"])
def test_a_bad_direct_request_is_refused_and_the_executor_keeps_serving(
    redis_url: str, tmp_path: Path, bad: str
) -> None:
    fast = Recorder("fast")
    with _running(redis_url, tmp_path, {"fast": fast, "other": Recorder("other")}) as r:
        gw = _serving(r, tmp_path)
        try:
            r.send("1", ["a"], "fast")
            _ok(*result_of(r.router, "1"), 0.0)
            r.ex._compute_s["fast"] = 1e-4  # measured fast (a cold first run can take longer)
            dropped = threading.Event()
            drop = r.ex.drops.drop
            r.ex.drops.drop = lambda *a, **k: (drop(*a, **k), dropped.set())  # type: ignore[method-assign]
            if bad == "header only":
                gw.send([b"fast", b"d1"])  # no request after the header: nobody to answer
                assert dropped.wait(20)
            else:  # the header says fast, the envelope other: refused by the batch runner
                gw.request("fast", "d1", envelope_model="other")
                body, _ = _answer(gw.next())
                assert body.requestId == "d1" and body.error.code == pb.ErrorCode.BAD_REQUEST
                assert "'other' in a batch of 'fast'" in (body.error.reason or "")
            gw.request("fast", "d2")  # the same connection still serves
            body, _ = _answer(gw.next())
            assert body.requestId == "d2" and body.error is None
            assert fast.ran_on == ["compute-0", "io-loop"]
        finally:
            gw.close()
