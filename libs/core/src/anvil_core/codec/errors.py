"""The codec's one exception type and the fixed set of reasons a receive loop counts a drop under."""

from __future__ import annotations

__all__ = ["REASONS", "ProtocolError"]

# Labels of anvil_dropped_messages_total{reason}: a fixed set, so no peer can add series.
REASONS = frozenset(
    {
        "undecodable",  # an offset, length or count outside the buffer; truncated or empty message
        "invalid",  # decodes, but breaks a stated constraint (enum, UTF-8, range, non-empty, frames)
        "version",  # another protocol version
        "unexpected",  # a well-formed message this socket does not take (wrong body type, wrong peer)
        "too_large",  # over a size bound (envelope bytes, decoded objects, vector length)
        "unregistered",  # an executor message from an executor the scheduler does not know
        "recv",  # the socket's receive failed
        "internal",  # a bug: handling raised something unforeseen (logged with its traceback)
    }
)


class ProtocolError(ValueError):
    """A message that is undecodable, of another version, or breaks a constraint of the schema.

    `str()` states the constraint ("InferRequest.priority is 7; it must be in 1..3"); `reason` is
    one of REASONS, for metrics.
    """

    def __init__(self, message: str, reason: str = "undecodable") -> None:
        super().__init__(message)
        assert reason in REASONS, reason
        self.reason = reason
