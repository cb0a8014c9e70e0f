"""Messages a receive loop refused: counted per (service, reason), logged at most once per interval
per reason, so a peer that floods garbage costs a counter increment each, not a log line each.

Every receive loop catches per message (issue #18): a crafted or corrupt message is answered with an
error where there is a sender to answer, then handed to ``DropLog.drop``, and the loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from anvil_core.codec.errors import REASONS

__all__ = ["DropLog", "dropped_messages"]

dropped_messages = Counter(
    "anvil_dropped_messages_total", "Peer messages refused by a receive loop", ["service", "reason"]
)


class DropLog:
    """Counter + rate-limited warning for refused messages of one service. Single-threaded use."""

    def __init__(
        self,
        log: logging.Logger,
        service: str,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.service = service
        self.every_s = every_s  # one line per reason per 5 s: a flood stays readable
        self._clock = clock
        self._next_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def drop(self, reason: str, detail: str, exc_info: bool = False) -> None:
        """Count one refused message; log it unless this reason was logged within ``every_s``.
        ``reason`` is one of codec.REASONS (anything else is counted as "internal": bounded labels)."""
        reason = reason if reason in REASONS else "internal"
        dropped_messages.labels(service=self.service, reason=reason).inc()
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = self._clock()
        if now < self._next_s.get(reason, float("-inf")):
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._next_s[reason] = now + self.every_s
        suppressed = self._suppressed.pop(reason, 0)
        self.log.warning(
            "message dropped",
            extra={"reason": reason, "detail": detail[:300], "suppressed_since_last": suppressed},
            exc_info=exc_info,
        )
