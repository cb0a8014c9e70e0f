"""Direct answers on the executor (peer_links.py `deliver`, docs/scheduler.md): the answers of a batch
whose requests name their gateway go to that gateway's answer socket, one message per gateway, and
the result for the scheduler lists them in ``deliveredIds`` and carries only the rest; what cannot
go (no socket, a gateway not reading) goes through the scheduler as before. A real answer socket
(anvil_core.unix_peers.AnswerSender), the real batch runner and codec; no scheduler."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.unix_link import HELLO, FrameReader
from anvil_core.unix_peers import AnswerSender, answer_path
from anvil_executor.batch_runner import finish_batch, prepare_batch
from anvil_executor.models.builtin import load_builtin
from anvil_executor.peer_links import deliver

sys.path.insert(0, str(Path(__file__).parent))
from wire_helpers import batch_frames


def _pending(rids: list[str], reply_to: list[str]) -> Any:
    body, frames = codec.unpack(batch_frames("b1", rids))
    body.replyTo = reply_to
    body, frames = codec.unpack(codec.pack(body, frames))  # as it arrives: verified
    models = {"identity": load_builtin("identity", 8)}
    return prepare_batch(models, body, frames, "ex-1", "cpu")


def _deliver(sender: AnswerSender, pending: Any) -> tuple[pb.BatchResultT, list[Any]]:
    result, out = finish_batch(pending)
    out = deliver(sender, pending, result, out)
    parts = codec.pack(result, out)
    body, frames = codec.unpack(parts)  # what goes to the scheduler verifies
    return body, frames


def _listen(tmp_path: Path, name: str) -> socket.socket:
    path = answer_path(str(tmp_path), name)
    assert path is not None
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    return server


def test_answers_go_to_their_gateways_and_the_scheduler_gets_the_rest(tmp_path: Path) -> None:
    server = _listen(tmp_path, "gw-a")
    got: list[list[bytes]] = []

    def serve() -> None:
        conn, _ = server.accept()
        reader = FrameReader()
        while len(got) < 2 and (data := conn.recv(1 << 20)):
            got.extend(reader.feed(data))
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    sender = AnswerSender(str(tmp_path), "ex-1", timeout_s=1)
    try:
        # r1, r3 to gw-a (one bundle); r2 names no gateway; r4's gateway has no socket
        pending = _pending(["r1", "r2", "r3", "r4"], ["gw-a", "", "gw-a", "gw-b"])
        body, frames = _deliver(sender, pending)
        t.join(10)
        assert got[0] == [HELLO, b"ex-1"]
        delivered = codec.unbundle(got[1])
        assert [b.requestId for b, _ in delivered] == ["r1", "r3"]
        assert all(isinstance(b, pb.InferResponseT) and b.error is None for b, _ in delivered)
        assert list(body.deliveredIds) == ["r1", "r3"]
        rest = [codec.read_response(g[0]).requestId for g in codec.split_groups(frames, body.frameCounts)]
        assert rest == ["r2", "r4"]  # through the scheduler, r4 after its direct try failed
        assert sender.sent == 1 and sender.failed == 1
    finally:
        sender.close()
        server.close()


def test_a_batch_that_names_no_gateway_is_untouched(tmp_path: Path) -> None:
    sender = AnswerSender(str(tmp_path), "ex-1")
    try:
        body, _ = _deliver(sender, _pending(["r1", "r2"], []))
        assert not body.deliveredIds and len(body.frameCounts) == 2
        assert sender.sent == 0 and sender.failed == 0
    finally:
        sender.close()
