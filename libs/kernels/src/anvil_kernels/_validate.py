"""Edge validation shared by every public op.

Every check raises ``ValueError`` whose message names the violated constraint, so a caller that
passes a bad buffer gets a sentence, never a numba crash or silent garbage. Kernels (``_cpu``
functions) assume these checks passed and only assert cheap invariants.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)  # supported INT4 group sizes along K
MASK_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in (np.bool_, np.uint8, np.int32, np.int64))
INDEX_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.int32), np.dtype(np.int64))


def array(
    name: str,
    a: object,
    dtype: DTypeLike | Sequence[DTypeLike],
    ndim: int | None = None,
    shape: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Check that ``a`` is a C-contiguous numpy array of the given dtype(s), rank and shape."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    choices = dtype if isinstance(dtype, (list, tuple)) else (dtype,)
    allowed = tuple(np.dtype(d) for d in choices)
    if a.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name} must have dtype {names}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use numpy.ascontiguousarray)")
    return a


def writable(name: str, a: np.ndarray) -> None:
    """Output buffers must be writable."""
    if not a.flags.writeable:
        raise ValueError(f"{name} must be writable")


def no_overlap(out_name: str, out: np.ndarray, **inputs: np.ndarray | None) -> None:
    """The output buffer must not share memory with any input (kernels read inputs after writing)."""
    for name, a in inputs.items():
        if a is not None and np.shares_memory(out, a):
            raise ValueError(f"{out_name} must not share memory with {name}")


def group_size(g: int, k: int) -> None:
    """``g`` must be a supported group size that divides K."""
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or int(g) not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {g!r}")
    if k <= 0 or k % int(g) != 0:
        raise ValueError(f"K={k} must be a positive multiple of group_size={g}")


def positive_dims(name: str, shape: tuple[int, ...]) -> None:
    """Empty tensors are rejected: every dimension must be at least 1."""
    if any(d <= 0 for d in shape):
        raise ValueError(f"{name} must have every dimension >= 1, got shape {shape}")


def finite_scalar(name: str, v: float, positive: bool = False) -> float:
    """A finite float (optionally > 0)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {v!r}") from None
    if not np.isfinite(f) or (positive and f <= 0.0):
        cond = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name} must be {cond}, got {v!r}")
    return f
