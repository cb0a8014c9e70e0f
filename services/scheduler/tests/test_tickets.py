"""Which gateways a batch names for direct answers (tickets.reply_to): only those on this host's Unix
link, and only under a name an executor will turn into a socket path."""

from __future__ import annotations

from anvil_scheduler.core import Request
from anvil_scheduler.tickets import Ticket, reply_to


def _req(rid: str, gateway: bytes) -> Request:
    return Request(rid, "m", 2, 0.0, 1.0, payload=Ticket(gateway, b"env", [], "t"))


def test_only_plain_names_of_gateways_on_the_unix_link_are_named() -> None:
    on_link = {b"gw-a.w0", b"gw/../x", b"gw\xff", b"g" * 65}
    reqs = [_req("1", b"gw-a.w0"), _req("2", b"gw-zmq"), _req("3", b"gw/../x"), _req("4", b"gw\xff")]
    reqs.append(_req("5", b"g" * 65))
    assert reply_to(reqs, on_link) == ["gw-a.w0", "", "", "", ""]
    assert reply_to(reqs[1:], on_link) is None  # nobody to name: the batch names no gateway
