"""Which models this scheduler treats as unloaded (undeployed or unloaded in the registry), kept
honest against the time its reads of the registry take.

The scheduler reads the registry's UNLOADED marks every `model_sync_interval_ms` on its background
loop and applies what it read on its own thread later. A read that began before a `load` (the
repository API's, or `anvil deploy`) can be applied after it, and a `load` answers once executors
serve the model, not once this scheduler has read it again. Two rules close both windows:

- **A stale unload is not applied**: a model a read marks unloaded that this scheduler did not yet
  treat as unloaded, but for which a gateway sent a request after the read began, stays served (that
  gateway saw it deployed after the read began); the next read decides.
- **A request for a model held unloaded waits for a fresh read** (parked) instead of an immediate
  NOT_FOUND: answered NOT_FOUND once a read that began after it still marks the model unloaded,
  handled as any request otherwise. Nothing it sent is dropped; it waits one registry round trip.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_PARKED", "Parked", "UnloadedView"]

MAX_PARKED = 4096  # beyond, a request for a model held unloaded is answered at once (a flood)
MAX_WAIT_S = 1.0  # a parked request no read has settled by then (registry unreachable) hears NOT_FOUND
REASK_S = 0.25  # a read asked for parked requests that has not come back by then is asked again


@dataclass(slots=True)
class Parked:
    """A request for a model held unloaded, as it reached the scheduler."""

    at: float  # monotonic arrival
    model: str
    args: tuple[Any, ...]  # what the service needs to answer or handle it again


@dataclass
class UnloadedView:
    models: frozenset[str] = frozenset()  # treated as unloaded now
    read_started: float = float("-inf")  # monotonic start of the read behind `models`
    _seen_at: dict[str, float] = field(default_factory=dict)  # model -> last request from a gateway
    _parked: list[Parked] = field(default_factory=list)
    reread_pending: bool = False  # a read for the parked requests was asked and has not come back
    asked_at: float = float("-inf")  # monotonic: when it was asked
    _applied: frozenset[str] = frozenset()  # `models` as the scheduler last acted on them

    def seen(self, model: str, now: float) -> None:
        """A gateway sent a request for `model` at `now` (monotonic). Call it only for models the
        scheduler serves or holds unloaded: the names come from clients."""
        self._seen_at[model] = now

    def apply(self, found: Iterable[str], started: float) -> None:
        """The result of a read of the registry that began at `started` (monotonic); one older than
        the read already applied (reads asked for parked requests overlap the periodic ones) is
        dropped."""
        self.reread_pending = False
        if started < self.read_started:
            return
        found = frozenset(found)
        newly = found - self.models
        doubtful = {m for m in newly if self._seen_at.get(m, float("-inf")) > started}
        self.models = found - doubtful
        self.read_started = started

    def revived(self) -> frozenset[str]:
        """Models held unloaded when this was last called that no longer are (deployed again)."""
        out, self._applied = self._applied - self.models, self.models
        return out

    def park(self, at: float, model: str, *args: Any) -> bool | None:
        """Hold a request for a model held unloaded; True when a fresh read should be asked for,
        None when MAX_PARKED are already waiting (answer it now)."""
        if len(self._parked) >= MAX_PARKED:
            return None
        self._parked.append(Parked(at, model, args))
        return self._ask(at)

    def _ask(self, now: float) -> bool:
        if self.reread_pending and now - self.asked_at < REASK_S:
            return False
        self.reread_pending, self.asked_at = True, now
        return True

    def settle(self, now: float) -> tuple[list[Parked], list[Parked], bool]:
        """Parked requests a read has answered since they arrived, or that waited MAX_WAIT_S:
        (answer NOT_FOUND: still unloaded, or no read came; handle: deployed again), and whether a
        read should be asked for the rest."""
        refused: list[Parked] = []
        handle: list[Parked] = []
        waiting: list[Parked] = []
        for p in self._parked:
            if p.at > self.read_started:
                (refused if now - p.at >= MAX_WAIT_S else waiting).append(p)
            elif p.model in self.models:
                refused.append(p)
            else:
                handle.append(p)
        self._parked = waiting
        return refused, handle, bool(waiting) and self._ask(now)

    @property
    def parked(self) -> int:
        return len(self._parked)
