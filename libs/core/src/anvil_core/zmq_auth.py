"""Who may talk on the internal ZeroMQ links (issue #18): the ZAP handler of a CURVE server, and a
watch on every CURVE socket's handshakes.

`CurveGate` runs pyzmq's ZAP authenticator (a thread of the server's context) with one domain per
link; a client is admitted when its public key is one of that domain's keys. Every refusal is
counted in ``anvil_zmq_refused_total{service,link,reason}`` and logged once per peer and state
change: a peer that retries a bad key every 100 ms gives one log line, not thousands.

A peer that does not speak CURVE at all never reaches ZAP (the handshake fails on the mechanism);
`watch_handshakes` sees those through a socket monitor and counts them the same way. Handshakes
happen once per connection, so none of this runs per message.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import zmq
from prometheus_client import Counter
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from anvil_core.logs import get_logger
from anvil_core.zmq_sockets import make_socket

__all__ = ["CurveGate", "PeerLog", "refused_peers", "watch_handshakes"]

log = get_logger("anvil.zmq_auth")

refused_peers = Counter(
    "anvil_zmq_refused_total", "ZeroMQ peers refused at the handshake", ["service", "link", "reason"]
)

_FAILURES: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake_failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "not_curve_or_bad_key",  # no CURVE, or a wrong server key
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused_by_zap",
}


class PeerLog:
    """Counts every refusal; logs a peer only when its state changes (first seen refused, refused
    for another reason, or refused again after being admitted). Remembers at most `max_peers`
    peers (oldest forgotten first), so a scan from many addresses cannot grow memory. Thread-safe."""

    def __init__(self, logger: logging.Logger, service: str, max_peers: int = 1024) -> None:
        self.log = logger
        self.service = service
        self.max_peers = max_peers
        self._state: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self.refusals = 0

    def verdict(self, link: str, peer: str, admitted: bool, reason: str = "") -> None:
        state = "admitted" if admitted else f"refused:{reason}"
        if not admitted:
            refused_peers.labels(service=self.service, link=link, reason=reason).inc()
        with self._lock:
            if not admitted:
                self.refusals += 1
            key = (link, peer)
            changed = self._state.get(key) != state
            self._state[key] = state
            self._state.move_to_end(key)
            while len(self._state) > self.max_peers:
                self._state.popitem(last=False)
        if not changed:
            return
        if admitted:
            self.log.info("zmq peer admitted", extra={"link": link, "peer": peer})
        else:
            self.log.warning(
                "zmq peer refused (counted in anvil_zmq_refused_total; logged again only if it changes)",
                extra={"link": link, "peer": peer, "reason": reason},
            )


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, remembering the address of the request being judged so that the
    credentials callback (which pyzmq gives only domain and key) can name the peer."""

    address = ""

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # ZAP request frames: version, request id, domain, address, identity, mechanism, credentials
        self.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)


class _Keys:
    """The credentials provider of one domain: admits exactly its set of Z85 public keys."""

    def __init__(self, gate: CurveGate, keys: frozenset[bytes]) -> None:
        self.gate = gate
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        admitted = key in self.keys
        peer = f"{self.gate.auth.address} key {key[:8].decode('ascii', 'replace')}..."
        self.gate.peers.verdict(domain, peer, admitted, "" if admitted else "unknown_key")
        return admitted


class CurveGate:
    """ZAP for the CURVE server sockets of one context: domain (= link name) -> admitted keys.

    The owner calls `start()` before binding any CURVE server socket (until then libzmq refuses
    every CURVE client: the sockets set ZAP_ENFORCE_DOMAIN), `watch()` on each such socket, and
    `stop()` after closing them and before terminating the context (the ZAP socket would hold
    ``ctx.term()`` forever).
    """

    def __init__(self, ctx: zmq.Context[Any], service: str, admitted: Mapping[str, frozenset[bytes]]) -> None:
        self.service = service
        self.peers = PeerLog(log, service)
        self.auth = _Authenticator(ctx, log=logging.getLogger("anvil.zmq_auth.zap"))
        # pyzmq's own debug lines would print every key; keep them quiet unless asked for
        self.auth.log.setLevel(logging.WARNING)
        self._admitted = dict(admitted)
        self._watches: list[threading.Thread] = []

    def start(self) -> None:
        self.auth.start()
        for domain, keys in self._admitted.items():
            self.auth.configure_curve_callback(domain, credentials_provider=_Keys(self, keys))

    def watch(self, sock: zmq.Socket[Any], link: str) -> None:
        self._watches.append(watch_handshakes(sock, self.peers, link))

    def stop(self) -> None:
        self.auth.stop()


def watch_handshakes(sock: zmq.Socket[Any], peers: PeerLog, link: str) -> threading.Thread:
    """Count and log (per `peers`) the failed handshakes of `sock`, and log success after failure.

    A daemon thread reads the socket's monitor; it ends when the socket closes (libzmq then sends
    MONITOR_STOPPED) or its context terminates. The peer's address is not in monitor events: the
    far end of a client socket is its endpoint, and a server names the link ("unauthenticated peer").
    Works for sockets of a sync or an asyncio context (the monitor is read with a sync socket of
    the same underlying context).
    """
    endpoint = f"inproc://anvil-monitor-{id(sock):x}"
    events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED
    for event in _FAILURES:
        events |= event
    sock.monitor(endpoint, events)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(sock.context.underlying)
    mon = make_socket(ctx, zmq.PAIR, connect=endpoint)
    server = bool(sock.getsockopt(zmq.CURVE_SERVER))

    def run() -> None:
        try:
            while True:
                msg = parse_monitor_message(mon.recv_multipart())
                event = msg["event"]
                if event == zmq.EVENT_MONITOR_STOPPED:
                    return
                raw = msg.get("endpoint")
                far = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "?")
                peer = "unauthenticated peer" if server else far
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    if not server:  # a server's successes are the ZAP callback's to log
                        peers.verdict(link, peer, True)
                elif not (server and event == zmq.EVENT_HANDSHAKE_FAILED_AUTH):  # ZAP counted it
                    peers.verdict(link, peer, False, _FAILURES.get(event, "handshake_failed"))
        except zmq.ContextTerminated:
            pass
        except zmq.ZMQError as exc:  # the watch is diagnostics: its end must not disturb the service
            log.warning("handshake watch ended", extra={"link": link, "err": str(exc)})
        finally:
            mon.close(linger=0)

    thread = threading.Thread(target=run, name=f"zmq-watch-{link}", daemon=True)
    thread.start()
    return thread
