"""CURVE on Anvil's sockets (issue #18): the gate admits exactly its domain's keys; refused peers
get nothing, are counted on every attempt and logged once per peer and state."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from anvil_core.curve import (
    CurveClient,
    CurveError,
    CurveServer,
    generate_role_keys,
    key_hex,
    parse_public_keys,
    read_secret_key,
)
from anvil_core.zmq_auth import CurveGate, PeerLog
from anvil_core.zmq_sockets import make_socket


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[dict[str, Any]]:
    """A scheduler-like pair of CURVE ROUTERs: domain gateway admits `gw`, executor admits `ex`."""
    ctx = zmq.Context()
    spub, ssec = zmq.curve_keypair()
    gw, ex = zmq.curve_keypair(), zmq.curve_keypair()
    gate = CurveGate(ctx, "test", {"gateway": frozenset({gw[0]}), "executor": frozenset({ex[0]})})
    gate.start()
    socks = {}
    for domain in ("gateway", "executor"):
        curve = CurveServer(ssec, domain)
        socks[domain] = make_socket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:0", curve=curve)
        gate.watch(socks[domain], domain)
    clients: list[zmq.Socket[bytes]] = []

    def client(domain: str, curve: CurveClient | None) -> zmq.Socket[bytes]:
        endpoint = socks[domain].getsockopt(zmq.LAST_ENDPOINT).decode()
        sock = make_socket(ctx, zmq.DEALER, connect=endpoint, curve=curve)
        clients.append(sock)
        return sock

    yield {"ctx": ctx, "gate": gate, "socks": socks, "spub": spub, "gw": gw, "ex": ex, "client": client}
    for sock in [*clients, *socks.values()]:
        sock.close()
    gate.stop()
    ctx.term()  # returns: the gate and every handshake watch let go of the context


def _received(sock: zmq.Socket[bytes], timeout_ms: int) -> list[bytes]:
    got = []
    while sock.poll(timeout_ms):
        got.append(sock.recv_multipart()[-1])
        timeout_ms = 50
    return got


def test_only_the_domains_keys_get_through_and_refusals_are_counted(server: dict[str, Any]) -> None:
    s, gate = server, server["gate"]
    stranger = zmq.curve_keypair()
    senders = {
        b"trusted": s["client"]("gateway", CurveClient(s["gw"][1], s["spub"])),
        b"no key": s["client"]("gateway", None),
        b"unknown key": s["client"]("gateway", CurveClient(stranger[1], s["spub"])),
        b"executor key": s["client"]("gateway", CurveClient(s["ex"][1], s["spub"])),
        b"wrong server": s["client"]("gateway", CurveClient(s["gw"][1], stranger[0])),
    }
    for name, sock in senders.items():
        sock.send_multipart([name])
    # every impostor's handshake fails at least once (each retries every 100 ms-1 s, counted each time)
    _until(lambda: gate.peers.refusals >= 4, "four refused handshakes")
    assert _received(s["socks"]["gateway"], 2000) == [b"trusted"]
    # the executor port admits the executor key only
    s["client"]("executor", CurveClient(s["gw"][1], s["spub"])).send_multipart([b"gateway key"])
    s["client"]("executor", CurveClient(s["ex"][1], s["spub"])).send_multipart([b"executor key"])
    assert _received(s["socks"]["executor"], 2000) == [b"executor key"]


def test_a_retrying_impostor_is_logged_once(server: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    s, gate = server, server["gate"]
    caplog.set_level(logging.INFO, logger="anvil.zmq_auth")
    stranger = CurveClient(zmq.curve_keypair()[1], s["spub"])
    for _ in range(3):  # one peer (address and key) trying again and again
        s["client"]("gateway", stranger).send_multipart([b"x"])
    _until(lambda: gate.peers.refusals >= 3, "three refused attempts of one peer")
    refused = [r for r in caplog.records if r.getMessage().startswith("zmq peer refused")]
    assert len(refused) == 1, [r.__dict__.get("peer") for r in refused]
    assert refused[0].__dict__["reason"] == "unknown_key"


def test_peer_log_logs_state_changes_and_forgets_the_oldest(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="t")
    peers = PeerLog(logging.getLogger("t"), "test", max_peers=2)
    for _ in range(3):
        peers.verdict("gateway", "a", False, "unknown_key")
    peers.verdict("gateway", "a", True)
    peers.verdict("gateway", "a", False, "unknown_key")
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "zmq peer refused",
        "zmq peer admitted",
        "zmq peer refused",
    ]
    assert peers.refusals == 4
    peers.verdict("gateway", "b", False, "x")
    peers.verdict("gateway", "c", False, "x")
    assert len(peers._state) == 2  # bounded: a scan from many addresses cannot grow it


def test_keys_on_disk_are_private_and_checked(tmp_path: Path) -> None:
    where = tmp_path / "secrets"
    env = generate_role_keys(where)
    assert where.stat().st_mode & 0o777 == 0o700
    for role in ("scheduler", "gateway", "executor"):
        path = where / f"{role}.key_secret"
        assert path.stat().st_mode & 0o777 == 0o600
        secret = read_secret_key(where, role)
        assert key_hex(zmq.curve_public(secret)) == env[f"ANVIL_CURVE_{role.upper()}_PUBLIC"]
    (where / "gateway.key_secret").write_text("too short")
    with pytest.raises(CurveError, match="64 hex digits"):
        read_secret_key(where, "gateway")
    with pytest.raises(CurveError, match="ANVIL_SECRETS_DIR is unset"):
        read_secret_key("", "gateway")
    with pytest.raises(CurveError, match="cannot read the executor secret key"):
        read_secret_key(tmp_path, "executor")
    with pytest.raises(CurveError, match="not hex"):
        parse_public_keys("~" * 64, "ANVIL_CURVE_GATEWAY_PUBLIC")
    pub = zmq.curve_keypair()[0]
    assert parse_public_keys(f"{key_hex(pub)}, {key_hex(pub)}", "x") == {pub}
