"""Embedding gather: out[b, t] = table[ids[b, t]]."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from anvil_kernels import _validate as v


@njit(parallel=True, cache=True)
def _embedding_cpu(ids: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    # ids (R,) int, table (V, H) f32, out (R, H) f32
    rows, h = out.shape
    for r in prange(rows):
        src = table[ids[r]]
        dst = out[r]
        for i in range(h):
            dst[i] = src[i]


def embedding(ids: np.ndarray, table: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Gather rows of ``table`` (V, H) float32 for ``ids`` (...) int32/int64 into out (..., H).
    Every id must lie in [0, V). Returns ``out``."""
    v.array("ids", ids, v.INDEX_DTYPES)
    v.positive_dims("ids", ids.shape)
    v.array("table", table, np.float32, 2)
    v.positive_dims("table", table.shape)
    vocab, h = table.shape
    v.array("out", out, np.float32, ids.ndim + 1, (*ids.shape, h))
    v.writable("out", out)
    v.no_overlap("out", out, table=table, ids=ids)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"ids must lie in [0, V={vocab}), got min {lo}, max {hi}")
    _embedding_cpu(ids.reshape(-1), table, out.reshape(-1, h))
    return out
