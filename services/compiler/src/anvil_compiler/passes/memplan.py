"""Liveness-based static memory plan for the activation bank.

Every buffer lives from the op that writes it to the last op that reads it (graph inputs from the
start, graph outputs to the end). Buffers are placed largest first, each at the lowest 256-aligned
offset that does not overlap a placed buffer whose lifetime intersects its own (greedy by size, as
TFLite's arena planner). Sizes are taken at max batch and max sequence; at run time a smaller batch
uses a prefix of each slot, so the offsets stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALIGN", "Interval", "plan_memory"]

ALIGN = 256


@dataclass(slots=True)
class Interval:
    key: int
    nbytes: int
    first: int  # index of the op that writes it (-1: a graph input)
    last: int  # index of the last op that reads it


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(intervals: list[Interval]) -> tuple[dict[int, int], int]:
    """(key -> offset, bank size in bytes)."""
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    offsets: dict[int, int] = {}
    for iv in sorted(intervals, key=lambda i: (-i.nbytes, i.first, i.key)):
        size = _align(max(iv.nbytes, 1))
        busy = sorted((off, sz) for off, sz, o in placed if not (o.last < iv.first or iv.last < o.first))
        offset = 0
        for off, sz in busy:
            if offset + size <= off:
                break
            offset = max(offset, off + sz)
        offsets[iv.key] = offset
        placed.append((offset, size, iv))
    total = max((off + sz for off, sz, _ in placed), default=0)
    return offsets, total
