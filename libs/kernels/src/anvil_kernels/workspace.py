"""Reusable scratch memory for kernels that need it (no allocation on the hot path).

Who owns what: the caller creates one ``Workspace`` per thread of execution and passes it to every
call; buffers grow on first use for a shape and are then reused, so steady-state calls allocate
nothing. A buffer handed to a kernel is only valid until the next call that uses the workspace.
"""

from __future__ import annotations

import numpy as np


class Workspace:
    """Named float32 scratch buffers that grow to the largest size requested and are reused."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous float32 view of ``shape`` (contents undefined), reusing storage."""
        size = 1
        for d in shape:
            size *= int(d)
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = np.empty(max(size, 1), dtype=np.float32)
            self._buffers[name] = buf
        return buf[:size].reshape(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(b.nbytes for b in self._buffers.values())
