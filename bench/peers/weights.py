"""mlp4x1024's weights, rebuilt in each peer's own venv (numpy only) from the executor's recipe:
for each of 4 layers, w = N(0,1)/sqrt(1024) (1024, 1024) then b = 0.01·N(0,1) (1024,), float32, drawn
in that order from numpy.random.default_rng(1234); ReLU between layers, not after the last."""

from __future__ import annotations

import numpy as np

WIDTH, LAYERS, SEED = 1024, 4, 1234
MAX_BATCH = 32  # every peer's dynamic batching: up to 32 requests ...
MAX_WAIT_S = 0.002  # ... or 2 ms after the first, whichever comes first


def layers() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        b = (0.01 * rng.standard_normal(WIDTH)).astype(np.float32)
        out.append((w, b))
    return out


def forward(weights: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    h = np.ascontiguousarray(x, dtype=np.float32)  # (B, 1024) fp32
    for i, (w, b) in enumerate(weights):
        h = h @ w + b
        if i < len(weights) - 1:
            np.maximum(h, 0.0, out=h)
    return h
