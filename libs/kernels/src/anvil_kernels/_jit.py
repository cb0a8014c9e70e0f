"""numba settings shared by every CPU kernel.

fastmath flag sets are chosen per kernel family:
- ELEMENTWISE: contraction into FMA only. No 'reassoc' (the INT4 GEMM vectorizes across N, so it
  needs no reassociation) and no 'nnan'/'ninf' (softmax masking relies on -inf being honoured).
- REDUCE: adds 'reassoc' so sums over a row (mean, variance, dot products) vectorize.
"""

from __future__ import annotations

import numpy as np

ELEMENTWISE: set[str] = {"contract", "nsz", "arcp"}
REDUCE: set[str] = {"contract", "nsz", "arcp", "reassoc"}

# Placeholders for optional array arguments (numba kernels take arrays, never None).
EMPTY1: np.ndarray = np.zeros(0, np.float32)
EMPTY2: np.ndarray = np.zeros((0, 0), np.float32)
