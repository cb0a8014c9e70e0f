"""What the scheduler keeps to answer a request, and where its answer goes.

A ``Ticket`` rides in each core ``Request`` (its payload): the gateway to answer, the frames to
forward to the executor (owned here until the request is answered) and the trace context. An answer
is the executor's response group forwarded unchanged, an error of the scheduler's (the shed codes and
texts below), or, with direct answers (docs/scheduler.md), written by the executor to the gateway's
own answer socket: ``reply_to`` names those gateways in a batch.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

from anvil_core.codec import pb
from anvil_core.unix_peers import is_answer_identity
from anvil_scheduler.core import Request, ShedReason

__all__ = ["SHED_CODES", "SHED_TEXT", "Ticket", "reply_to", "ticket_of"]

SHED_CODES = {ShedReason.DEADLINE: pb.ErrorCode.DEADLINE, ShedReason.OVERLOAD: pb.ErrorCode.OVERLOAD}
SHED_TEXT = {
    ShedReason.DEADLINE: "shed: it cannot finish by its deadline even alone",
    ShedReason.OVERLOAD: "shed under overload: lower priorities go first",
}


@dataclass(slots=True)
class Ticket:
    """What the scheduler keeps of a request besides the core's record: where to answer, and the
    frames to forward (owned here until the request is answered)."""

    gateway: bytes
    envelope: Any
    frames: list[Any]
    trace_id: str
    traceparent: str = ""  # the gateway's dispatch span (W3C), when it traces


def ticket_of(r: Request) -> Ticket:
    ticket = r.payload
    assert isinstance(ticket, Ticket), f"request {r.request_id} carries no ticket"
    return ticket


def reply_to(requests: Sequence[Request], unix_gateways: Container[bytes]) -> list[str] | None:
    """``Batch.reply_to`` of a batch going to an executor on this host's Unix link: per request, its
    gateway's identity where that gateway is on the Unix link too and the executor will accept the
    name (``is_answer_identity``), else ""; None when no request's gateway qualifies."""
    out = []
    for r in requests:
        gateway = ticket_of(r).gateway
        name = gateway.decode("ascii", "replace") if gateway in unix_gateways else ""
        out.append(name if name and is_answer_identity(name) else "")
    return out if any(out) else None
