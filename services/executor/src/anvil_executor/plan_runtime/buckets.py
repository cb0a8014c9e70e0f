"""Shape buckets: the (batch, sequence) shapes a GPU plan is captured for, and which one a batch uses.

A CUDA graph is fixed to its shapes, so the GPU runtime captures one graph per (B, T) bucket at load
and pads each batch up to the smallest bucket that holds it. Buckets trade padding waste against
the number of graphs: batch buckets double up to 64, then step by 64 (..., 64, 128, 192, ...
max_batch); sequence buckets step by 8 tokens up to 64 and by a quarter of the value above that, so
a batch pads at most ~25% beyond its
longest sequence (corpus-v2: 39 tokens mean, p99 75; docs/executor_gpu.md reports the measured waste).

No GPU here: this module is plain Python and is tested on the CPU.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = ["Buckets", "batch_buckets", "seq_buckets"]


BATCH_STEP = 64  # above this, batch buckets step by it instead of doubling


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... 64, then every 64 (128, 192, 256, ...), up to and including ``max_batch``.

    Doubling all the way padded a batch of 137 rows to 256 (46% of the rows wasted) on the H200; steps
    of 64 keep the padding under a third at 192 and under an eighth near 512, for a few more graphs."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b = b * 2 if b < BATCH_STEP else b + BATCH_STEP
    out.append(max_batch)
    return tuple(out)


def seq_buckets(max_seq: int) -> tuple[int, ...]:
    """Steps of 8 tokens up to 64, then steps of ~1/4 (rounded up to 16), up to ``max_seq``.

    A model without a sequence dimension (max_seq = 1) has the single bucket 1.
    """
    if max_seq < 1:
        raise ValueError(f"max_seq must be >= 1, got {max_seq}")
    if max_seq == 1:
        return (1,)
    out: list[int] = []
    t = 8
    while t < max_seq:
        out.append(t)
        step = 8 if t < 64 else max(16, -(-(t // 4) // 16) * 16)
        t += step
    out.append(max_seq)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Buckets:
    """The capture grid of one model: every (b, t) in ``batch`` x ``seq``."""

    batch: tuple[int, ...]
    seq: tuple[int, ...]

    @classmethod
    def for_plan(cls, max_batch: int, max_seq: int) -> Buckets:
        return cls(batch_buckets(max_batch), seq_buckets(max_seq))

    def pick(self, rows: int, tokens: int) -> tuple[int, int]:
        """The smallest bucket holding ``rows`` x ``tokens``; ValueError past the largest."""
        if rows < 1 or tokens < 1:
            raise ValueError(f"a batch needs >= 1 row and token, got {rows} x {tokens}")
        if rows > self.batch[-1] or tokens > self.seq[-1]:
            raise ValueError(
                f"batch {rows} x {tokens} tokens exceeds the largest bucket {self.batch[-1]} x {self.seq[-1]}"
            )
        b = self.batch[bisect.bisect_left(self.batch, rows)]
        return b, self.seq[bisect.bisect_left(self.seq, tokens)]

    def all(self) -> list[tuple[int, int]]:
        return [(b, t) for b in self.batch for t in self.seq]

    @staticmethod
    def waste(rows_tokens: list[tuple[int, int]], bucket: tuple[int, int]) -> float:
        """Share of the bucket's (row, token) cells that are padding: requests of (rows, tokens)
        packed into one bucket (each request padded to the bucket's T, rows to its B)."""
        used = sum(r * t for r, t in rows_tokens)
        cells = bucket[0] * bucket[1]
        return 1.0 - used / cells if cells else 0.0
