"""anvil_core.unix_link: the same-host links over Unix stream sockets (issue #19). Real sockets in a
temporary directory: framing and its limits, the hello that names a peer, a reconnecting peer
replacing its older connection, refused peers, large messages written in parts, and the dealer
reconnecting by itself after the router goes away."""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from anvil_core.unix_link import (
    HELLO,
    MAX_FRAMES,
    Conn,
    FrameReader,
    LinkError,
    PolledFds,
    UnixDealer,
    UnixRouter,
    encode,
    unix_endpoint,
    unix_path,
)
from anvil_core.unix_peers import AnswerSender, answer_path, direct_path


def _wire(parts: list[bytes]) -> bytes:
    return b"".join(bytes(b) for b in encode(parts))


def test_messages_are_cut_out_of_a_stream_fed_in_any_pieces() -> None:
    msgs = [[b"env", b"", b"x" * 70_000], [b"one"]]
    stream = b"".join(_wire(m) for m in msgs)
    for step in (1, 3, 4096, len(stream)):
        reader, got = FrameReader(), []
        for i in range(0, len(stream), step):
            got += reader.feed(stream[i : i + step])
        assert got == msgs


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (struct.pack("<I", 0), "0 frames"),
        (struct.pack("<I", MAX_FRAMES + 1), f"{MAX_FRAMES + 1} frames"),
        (struct.pack("<II", 1, 2_000), "2000 bytes"),
    ],
)
def test_a_message_beyond_the_limits_is_refused_before_its_bytes_arrive(data: bytes, why: str) -> None:
    with pytest.raises(LinkError, match=why):
        FrameReader(max_msg_bytes=1_000).feed(data)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[UnixRouter]:
    r = UnixRouter(unix_path(unix_endpoint(str(tmp_path), "executor")))
    try:
        yield r
    finally:
        r.close()


def _serve(router: UnixRouter, until: Any, timeout_s: float = 5.0) -> list[tuple[bytes, list[bytes]]]:
    """Poll the router (as the scheduler's loop does) until ``until(got)`` holds."""
    got: list[tuple[bytes, list[bytes]]] = []
    deadline = time.monotonic() + timeout_s
    while not until(got):
        assert time.monotonic() < deadline, f"timed out; got {got}"
        poller = zmq.Poller()
        for fd, wants_write in router.fds():
            poller.register(fd, zmq.POLLIN | (zmq.POLLOUT if wants_write else 0))
        for fd, flags in poller.poll(50):
            msgs, _ = router.on_ready(fd, bool(flags & zmq.POLLOUT))
            got += msgs
    return got


def _client(path: str, identity: bytes) -> Conn:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    conn = Conn(sock)
    conn.send([HELLO, identity])
    return conn


def _read(conn: Conn, n: int = 1, timeout_s: float = 5.0) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline
        conn.flush()
        got += conn.read()
        time.sleep(0.001)
    return got


def test_messages_before_a_malformed_one_are_returned_and_the_next_feed_raises() -> None:
    good = b"".join(encode([b"a", b"bc"])) + b"".join(encode([b"d"]))
    reader = FrameReader()
    assert reader.feed(good + (0).to_bytes(4, "little")) == [[b"a", b"bc"], [b"d"]]
    assert reader.broken is not None and "0 frames" in str(reader.broken)
    with pytest.raises(LinkError, match="0 frames"):
        reader.feed(b"".join(encode([b"e"])))
    fresh = FrameReader()  # nothing good before it: raised at once
    with pytest.raises(LinkError):
        fresh.feed((0).to_bytes(4, "little"))


def test_the_socket_is_0600_and_peers_are_routed_by_their_hello(router: UnixRouter) -> None:
    assert stat.S_IMODE(os.stat(router.path).st_mode) == 0o600
    a, b = _client(router.path, b"ex-a"), _client(router.path, b"ex-b")
    a.send([b"from a"])
    b.send([b"from b", b"2"])
    got = _serve(router, lambda g: len(g) == 2)
    assert sorted(got) == [(b"ex-a", [b"from a"]), (b"ex-b", [b"from b", b"2"])]
    assert router.send(b"ex-b", [b"to b"]) and not router.send(b"nobody", [b"x"])
    assert _read(b) == [[b"to b"]]
    a.close()
    b.close()
    router.close()  # (the fixture's close after it is harmless)
    assert not os.path.exists(router.path)  # the socket file goes with the router


def test_a_reconnecting_peer_replaces_its_older_connection(router: UnixRouter) -> None:
    old = _client(router.path, b"ex-a")
    old.send([b"1"])
    _serve(router, lambda g: len(g) == 1)
    new = _client(router.path, b"ex-a")  # restarted: same identity
    new.send([b"2"])
    assert _serve(router, lambda g: len(g) == 1) == [(b"ex-a", [b"2"])]
    assert router.send(b"ex-a", [b"to the new one"])
    assert _read(new) == [[b"to the new one"]]
    assert len(router.conns) == 1


def test_a_peer_without_a_hello_or_breaking_the_format_is_closed(router: UnixRouter) -> None:
    rude = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    rude.connect(router.path)
    rude.sendall(_wire([b"GET / HTTP/1.1"]))  # not a hello
    problems: list[tuple[str, str]] = []
    deadline = time.monotonic() + 5
    while not problems and time.monotonic() < deadline:
        for fd, _ in router.fds():
            problems += router.on_ready(fd)[1]
    assert problems and problems[0][0] == "invalid"
    assert rude.recv(10) == b""  # closed by the router
    assert router.conns == {}
    bad = _client(router.path, b"ex-bad")
    bad.sock.sendall(struct.pack("<I", MAX_FRAMES + 1))
    _serve(router, lambda g: b"ex-bad" not in router.conns and not router._fresh)


def test_a_message_larger_than_the_socket_buffer_arrives_whole(router: UnixRouter) -> None:
    peer = _client(router.path, b"ex-a")
    peer.send([b"hi"])
    _serve(router, lambda g: len(g) == 1)
    big = os.urandom(8 << 20)  # several times the socket buffer: written over many poll turns
    assert router.send(b"ex-a", [b"env", big])
    assert router.conns[b"ex-a"].wants_write
    got: list[list[bytes]] = []
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline
        _serve(router, lambda g: True)  # one turn: flush what the socket takes
        for fd, flags in ((f, w) for f, w in router.fds() if w):
            router.on_ready(fd, flags)
        got += peer.read()
    assert got == [[b"env", big]]


def test_the_dealer_reconnects_after_the_router_restarts_and_says_hello_again(tmp_path: Path) -> None:
    endpoint = unix_endpoint(str(tmp_path), "executor")
    dealer = UnixDealer("ex-a", retry_s=0.01)
    router = UnixRouter(unix_path(endpoint))
    try:
        dealer.follow(endpoint)
        assert dealer.connected and dealer.connects == 1
        dealer.send([b"register"])
        assert _serve(router, lambda g: len(g) == 1) == [(b"ex-a", [b"register"])]
        router.close()  # the scheduler dies
        deadline = time.monotonic() + 5
        while dealer.connected:  # the loss is seen on the next read or send
            assert time.monotonic() < deadline
            dealer.read()
            time.sleep(0.01)
        with pytest.raises(ConnectionError):
            dealer.send([b"lost"])
        router = UnixRouter(unix_path(endpoint))  # it comes back
        while not dealer.tick():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert dealer.connects == 2
        dealer.send([b"register again"])
        assert _serve(router, lambda g: len(g) == 1) == [(b"ex-a", [b"register again"])]
        assert router.send(b"ex-a", [b"batch"])
        while not (got := dealer.read()):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert got == [[b"batch"]]
    finally:
        dealer.close()
        router.close()


def test_the_endpoint_names_a_socket_path_and_refuses_one_too_long(tmp_path: Path) -> None:
    assert unix_path(unix_endpoint(str(tmp_path), "gateway")) == str(tmp_path.resolve() / "gateway.usock")
    with pytest.raises(ValueError, match="longer than"):
        unix_endpoint(str(tmp_path / ("d" * 120)), "gateway")
    with pytest.raises(ValueError, match="not a unix link endpoint"):
        unix_path("ipc:///tmp/x.sock")


def test_a_peer_that_stops_reading_is_cut_off_at_the_queue_cap(
    router: UnixRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anvil_core.unix_link as ul

    monkeypatch.setattr(ul, "MAX_QUEUED_BYTES", 4 << 20)
    stalled = _client(router.path, b"ex-a")
    stalled.send([b"hi"])
    _serve(router, lambda g: len(g) == 1)
    chunk = b"x" * (1 << 20)
    sent = 0
    while router.send(b"ex-a", [chunk]):  # never read by the peer
        sent += 1
        assert sent < 64, "the queue grew without bound"
    assert b"ex-a" not in router.conns  # cut off; a reconnect would be a new connection
    assert sent >= 4


def test_a_connection_that_ends_is_reported_lost_once_and_a_replaced_one_is_not(router: UnixRouter) -> None:
    old = _client(router.path, b"ex-a")
    old.send([b"1"])
    _serve(router, lambda g: len(g) == 1)
    new = _client(router.path, b"ex-a")  # a restart: the newer connection replaces the older
    new.send([b"2"])
    _serve(router, lambda g: len(g) == 1)
    assert router.take_lost() == []
    new.close()  # the peer dies
    _serve(router, lambda g: b"ex-a" not in router.conns)
    assert router.take_lost() == [b"ex-a"] and router.take_lost() == []


def test_answer_and_direct_paths_are_made_only_from_plain_identities(tmp_path: Path) -> None:
    assert answer_path(str(tmp_path), "gw-host-1.w0") == str(tmp_path / "answers-gw-host-1.w0.usock")
    assert direct_path(str(tmp_path), "ex-host-1") == str(tmp_path / "direct-ex-host-1.usock")
    for make in (answer_path, direct_path):
        for bad in ("", "../x", "a/b", "gw 1", "x" * 65, "gw\x00"):
            assert make(str(tmp_path), bad) is None, bad
        assert make("/" + "d" * 100, "gw") is None  # longer than a socket path can be


class _Poller:
    """Records what PolledFds asks of a poller."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.calls = 0

    def register(self, fd: int, flags: int) -> None:
        self.fds[fd] = flags
        self.calls += 1

    def unregister(self, fd: int) -> None:
        del self.fds[fd]
        self.calls += 1


def test_polled_fds_follow_a_routers_connections_and_touch_the_poller_only_on_a_change(
    tmp_path: Path,
) -> None:
    router = UnixRouter(str(tmp_path / "r.usock"))
    poller, polled = _Poller(), PolledFds(1, 2)
    try:
        polled.watch(poller, router)
        assert poller.fds == {router.listener.fileno(): 1}
        calls = poller.calls
        polled.watch(poller, router)
        assert poller.calls == calls  # nothing changed: nothing asked
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(str(tmp_path / "r.usock"))
        router.on_ready(router.listener.fileno())  # accepted: its fd joins
        polled.watch(poller, router)
        assert len(poller.fds) == 2
        peer.sendall(_wire([HELLO, b"gw"]))
        (fd,) = [f for f in poller.fds if f != router.listener.fileno()]
        router.on_ready(fd)  # named by its hello
        peer.close()
        router.on_ready(fd)  # its end read: dropped
        polled.watch(poller, router)
        assert poller.fds == {router.listener.fileno(): 1}
    finally:
        router.close()


def _answer_socket(tmp_path: Path, name: str) -> socket.socket:
    path = answer_path(str(tmp_path), name)
    assert path is not None
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    return server


def test_an_answer_goes_whole_after_a_hello_and_a_missing_socket_is_not_retried_at_once(
    tmp_path: Path,
) -> None:
    server = _answer_socket(tmp_path, "gw-1")
    sender = AnswerSender(str(tmp_path), "ex-1", timeout_s=1, retry_s=60)
    try:
        big = os.urandom(3 << 20)  # larger than the socket buffer: written over several sendmsg calls
        got: list[list[bytes]] = []

        def serve() -> None:
            conn, _ = server.accept()
            reader = FrameReader()
            while len(got) < 2 and (data := conn.recv(1 << 20)):
                got.extend(reader.feed(data))
            conn.close()

        t = threading.Thread(target=serve)
        t.start()
        assert sender.send("gw-1", [b"envelope", big])
        t.join(10)
        assert got == [[HELLO, b"ex-1"], [b"envelope", big]]
        assert sender.sent == 1
        assert not sender.send("gw-2", [b"x"])  # no such gateway socket
        (tmp_path / "answers-gw-2.usock").touch()  # appears, but is not tried again before retry_s
        assert not sender.send("gw-2", [b"x"]) and sender.failed == 2
        assert not sender.send("../gw-1", [b"x"])  # never a path outside the link directory
    finally:
        sender.close()
        server.close()


def test_a_gateway_that_stops_reading_costs_at_most_the_timeout_and_its_connection(tmp_path: Path) -> None:
    server = _answer_socket(tmp_path, "gw-1")
    sender = AnswerSender(str(tmp_path), "ex-1", timeout_s=0.05, retry_s=60)
    try:
        t0 = time.monotonic()
        ok = sender.send("gw-1", [os.urandom(16 << 20)])  # accepted, never read
        took = time.monotonic() - t0
        assert not ok and took < 2, took
        assert not sender._conns  # closed: a half-written message must not be followed by another
    finally:
        sender.close()
        server.close()
