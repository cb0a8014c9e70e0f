"""The largest request body a model can need, checked from Content-Length before a byte is read.

A request carries at most `max_batch` rows of every input. As binary tensors a row of an input is
its elements times the datatype's size; as JSON each element is its number's text and a separator,
at most `JSON_BYTES_PER_ELEMENT` bytes. So a body larger than `SKELETON_BYTES` plus
`max_batch x sum over inputs of (elements per row x max(itemsize, JSON_BYTES_PER_ELEMENT))` cannot
be a valid request for the model, and is refused (413) unread. Inputs of variable size (a `-1` dim,
BYTES strings) have no such bound: their models get the global cap (`max_body_bytes`) alone.
"""

from __future__ import annotations

import math
from functools import lru_cache

from anvil_core.model_spec import ModelSpec
from anvil_core.tensors import DATATYPES

__all__ = ["JSON_BYTES_PER_ELEMENT", "SKELETON_BYTES", "model_body_limit"]

# The longest JSON number a float64 becomes ("-2.2250738585072014e-308", 24 bytes), ", " and slack.
JSON_BYTES_PER_ELEMENT = 32
# Everything but the data: names, shapes, datatypes, parameters, outputs, whitespace.
SKELETON_BYTES = 64 << 10


@lru_cache(maxsize=1024)
def model_body_limit(spec: ModelSpec, cap: int) -> tuple[int, str]:
    """(limit in bytes, how it was derived) for requests to `spec`; never above `cap`."""
    rows = max(1, spec.max_batch)
    per_row = 0
    for t in spec.inputs:
        dtype = DATATYPES.get(t.datatype)
        if dtype is None or any(d < 0 for d in t.dims):  # BYTES or a variable dim: no bound
            return cap, "the server's max_body_bytes"
        per_row += math.prod(t.dims) * max(dtype.itemsize, JSON_BYTES_PER_ELEMENT)
    limit = SKELETON_BYTES + rows * per_row
    if limit >= cap:
        return cap, "the server's max_body_bytes"
    return limit, (
        f"model {spec.name!r}: max_batch {spec.max_batch} x {per_row} bytes per row as JSON "
        f"+ {SKELETON_BYTES} bytes"
    )
