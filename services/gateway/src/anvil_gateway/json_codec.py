"""The gateway's JSON codec: orjson's speed, the stdlib json module's results.

For a KServe v2 body of 1,024 floats (21 kB), json.loads took ~320 µs and json.dumps ~600 µs on
the 2-core dev machine; orjson takes ~40 µs and ~30 µs. Where orjson would answer differently, the
json module answers:

- `loads` returns what `json.loads` returns and raises what it raises. orjson refuses NaN,
  Infinity, a UTF-8 BOM, UTF-16/32 and lone surrogates (the stdlib accepts them), reads integers
  outside [-2**63, 2**64) as floats, and nests 1,024 deep where the stdlib stops near the
  interpreter's recursion limit; bodies where any of this can matter go to the stdlib, as do errors
  (so messages are unchanged).
- `dumps` writes the values `json.dumps(doc, separators=(",", ":"))` writes, numpy arrays as their
  `tolist()`, so FP32 data reads back as the same float64 numbers as before. Only spelling may
  differ: `1e-5` for `1e-05`, UTF-8 for `\\u00e9`. NaN and ±Infinity stay `NaN`/`Infinity`, as
  the stdlib writes them (orjson would write null).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

__all__ = ["dumps", "loads"]

# Openers ("[" and "{") up to which orjson's result is the stdlib's: the stdlib nests ~1,000 deep
# less the caller's stack (~100 frames under uvicorn); 512 leaves room. Nested data of more than
# ~500 rows takes the stdlib too.
SAFE_DEPTH = 512
# Numbers written per orjson call for large arrays (~1.3 MB of text, ~2 ms).
STEP_ELEMENTS = 1 << 16
# An integer part of 19 digits or more may be an integer outside [-2**63, 2**64), which orjson reads
# as a float. In JSON an integer part starts the body or follows "[", "-", ":", "," or whitespace
# (all mapped to ","); digits after "." (0.0012345678901234567) or "e" are a float's and can't be.
_MARKS = bytes.maketrans(b"0123456789[{-: \t\n\r", b"0000000000,,,,,,,,")
_LONG_INT = b"0" * 19
_LONG_INT_AFTER = b"," + _LONG_INT


def loads(body: bytes | bytearray) -> Any:
    """`json.loads(body)`: the same value, or the same exception (JSONDecodeError, UnicodeDecodeError,
    RecursionError)."""
    if _orjson_agrees(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # invalid, or NaN/Infinity/BOM/UTF-16/surrogates: the stdlib decides and words it
    return json.loads(body)


def _orjson_agrees(body: bytes | bytearray) -> bool:
    """Whether orjson, if it parses `body`, gives what the stdlib gives: few enough openers, no long
    integer. Conservative: brackets and digits inside strings count too. Costs about one orjson
    parse (three passes over the bytes), the price of reading integers past 64 bits exactly."""
    if body.count(b"[") + body.count(b"{") > SAFE_DEPTH:
        return False
    marks = body.translate(_MARKS)
    return not (marks.startswith(_LONG_INT) or _LONG_INT_AFTER in marks)


def dumps(doc: dict[str, Any]) -> bytes:
    """`json.dumps(doc, separators=(",", ":")).encode()` in value, numpy arrays written as `tolist()`."""
    try:
        return orjson.dumps(doc, default=_orjson_default)
    except orjson.JSONEncodeError:  # e.g. a lone surrogate in a string, which the stdlib escapes
        return json.dumps(doc, separators=(",", ":"), default=_tolist).encode()


def _orjson_default(obj: Any) -> orjson.Fragment:
    if not isinstance(obj, np.ndarray):
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    if obj.ndim == 1 and obj.size > STEP_ELEMENTS:
        # Written a step at a time: one dumps of millions of numbers would hold the GIL (and so the
        # event loop, when this runs on a thread) for its whole length.
        steps = (_array_text(obj[i : i + STEP_ELEMENTS]) for i in range(0, obj.size, STEP_ELEMENTS))
        return orjson.Fragment(b"[" + b",".join(text[1:-1] for text in steps) + b"]")
    return orjson.Fragment(_array_text(obj))


def _array_text(obj: np.ndarray) -> bytes:
    if obj.dtype.kind == "f":
        if not np.isfinite(obj).all():  # orjson writes null; the stdlib NaN/Infinity
            return json.dumps(obj.tolist(), separators=(",", ":")).encode()
        obj = obj.astype(np.float64)  # tolist()'s numbers: float32 0.1 is 0.10000000149011612
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def _tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")
