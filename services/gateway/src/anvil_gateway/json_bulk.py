"""Large JSON request bodies parsed in steps that each hold the GIL briefly (issue #18).

A 20 MiB KServe body of numbers took ~0.5 s as one `json.loads` and one `np.array` call. A C call
holds the GIL for its whole length, so moving it to a thread alone does not free the event loop:
the loop waits for the GIL as long as the call runs. Here the bulk of such a body, its large arrays
of numbers (the `data` of inputs), is cut out of the text and converted `STEP_BYTES` at a time:
each step is one `json_codec.loads` of 64 KiB and one numpy conversion, ~0.25 ms. The rest of the
body (names, shapes, parameters: small) goes through `json_codec.loads` whole.

`loads_steps` is the same parse as a generator that yields between steps: the gateway drives it on
the event loop itself (`request_path.run_steps`, other tasks run at every yield), so no other
thread holds the GIL the loop needs, and the loop is held at most one step (~0.25 ms) whatever the OS
does with other threads. `loads` runs the steps without yielding (a parse thread: gRPC, embeddings).

Values and errors are those of `json_codec.loads` (the stdlib's): a cut-out array reads back as the
list it was; a malformed one raises `json.JSONDecodeError`. What is not cut out (arrays with
strings, objects or empty sub-lists; anything under `MIN_SPAN_BYTES`) is parsed with the rest.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Generator, Iterator
from typing import Any, TypeVar

import numpy as np

from anvil_gateway import json_codec

__all__ = [
    "MIN_SPAN_BYTES",
    "STEP_BYTES",
    "NumberArray",
    "Steps",
    "drain",
    "loads",
    "loads_steps",
    "materialize",
]

_T = TypeVar("_T")
Steps = Generator[None, None, _T]  # a computation that yields between its steps and returns a _T


def drain(steps: Steps[_T]) -> _T:
    """Run `steps` to the end without yielding; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


STEP_BYTES = 64 << 10  # ~0.25 ms of orjson + numpy per step on the 2-core dev machine (0.6 ms at most)
MIN_SPAN_BYTES = 64 << 10  # smaller arrays cost less to parse whole than to cut out
# Bytes a JSON array of numbers (or booleans; NaN/Infinity as the stdlib writes them) is made of.
_NUMBER_BYTES = b"0123456789+-.eE,[] \t\n\rtruefalsNIinty"
_DATA_KEY = b'"data"'
_KEY_TAIL = re.compile(rb"\s*:\s*\[")
_EMPTY_LIST = re.compile(rb"\[\s*\]")
# What valid JSON never holds in a nested array of numbers: "[," "[]" ",]" "]1" "1[". Checked per
# step on "[" + step + "]", where a step never starts or ends with its cut comma.
_BAD_NESTING = re.compile(rb",\s*\]|\[\s*[,\]]|\][\s]*[^\s,\]]|[^\s,\[][\s]*\[")
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")


class NumberArray:
    """A cut-out array of numbers: `body[start:end]` is its JSON text, `[` to `]` (nested lists
    flatten in row-major order, as `json_tensors` flattens them)."""

    __slots__ = ("body", "end", "nested", "start")

    def __init__(self, body: bytes | bytearray, start: int, end: int, nested: bool) -> None:
        self.body, self.start, self.end, self.nested = body, start, end, nested

    def steps(self) -> Iterator[list[Any]]:
        """The values, flat, about STEP_BYTES of text at a time; JSONDecodeError if malformed."""
        pos, end = self.start + 1, self.end - 1  # inside the outer brackets
        first = True
        while pos < end:
            cut = end if end - pos <= STEP_BYTES else self.body.rfind(b",", pos, pos + STEP_BYTES)
            if cut <= pos:  # no comma within a step: no number is that long
                raise json.JSONDecodeError("a value longer than a step", "", pos)
            text = b"[" + self.body[pos:cut] + b"]"
            if self.nested:
                bad = _BAD_NESTING.search(text)
                if bad is not None:
                    raise json.JSONDecodeError("malformed nested list", "", pos + bad.start())
                text = b"[" + text[1:-1].translate(_BRACKETS_TO_SPACES) + b"]"
            values = json_codec.loads(text)
            pos = cut + 1
            if values:
                yield values
            elif pos <= end or not first:  # "[1, ,2]" or "[1, ]": a value is missing
                raise json.JSONDecodeError("Expecting value", "", pos)
            first = False

    def tolist(self) -> list[Any]:
        out: list[Any] = []
        for values in self.steps():
            out.extend(values)
        return out


def loads(body: bytes | bytearray) -> Any:
    """`json_codec.loads(body)`, with large number arrays left as `NumberArray`s where they are the
    `data` of an object (call `materialize` for plain lists)."""
    return drain(loads_steps(body))


def loads_steps(body: bytes | bytearray) -> Steps[Any]:
    """`loads`, yielding between steps of its scan for number arrays."""
    spans = (yield from _number_spans(body)) if len(body) >= MIN_SPAN_BYTES else []
    if not spans:
        return json_codec.loads(body)
    tag = "\x00anvil-bulk-" + secrets.token_hex(8) + "-"  # unforgeable: a client cannot send a marker
    parts, pos = [], 0
    arrays: dict[str, NumberArray] = {}
    for i, (start, end, nested) in enumerate(spans):
        marker = f"{tag}{i}"
        arrays[marker] = NumberArray(body, start, end, nested)
        parts += [body[pos:start], json.dumps(marker).encode()]
        pos = end
    parts.append(body[pos:])
    doc = json_codec.loads(b"".join(parts))
    return _restore(doc, arrays)


def materialize(value: Any) -> Any:
    """`value` with every NumberArray in it turned into its list."""
    if isinstance(value, NumberArray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [materialize(v) for v in value]
    return value


def _restore(value: Any, arrays: dict[str, NumberArray]) -> Any:
    if isinstance(value, str):
        return arrays.get(value, value)
    if isinstance(value, dict):
        return {k: _restore(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, arrays) for v in value]
    return value


def _number_spans(body: bytes | bytearray) -> Steps[list[tuple[int, int, bool]]]:
    """(start, end, nested) of each `"data": [...]` array of at least MIN_SPAN_BYTES that holds
    only numbers, booleans, commas, whitespace and non-empty nested lists."""
    spans: list[tuple[int, int, bool]] = []
    pos = 0
    while (key := body.find(_DATA_KEY, pos)) >= 0:  # a memchr-speed scan, not a regex one
        pos = key + len(_DATA_KEY)
        tail = _KEY_TAIL.match(body, pos)
        if tail is None or _escaped(body, key):
            continue  # not a key, or `\"data\":[` inside a string
        start = pos = tail.end() - 1  # the "["
        end, nested = yield from _array_end(body, start)
        if end is None:
            continue
        if end - start >= MIN_SPAN_BYTES and not (nested and _EMPTY_LIST.search(body, start, end)):
            spans.append((start, end, nested))
        pos = end
    return spans


def _escaped(body: bytes | bytearray, quote: int) -> bool:
    n = 0
    while quote - n - 1 >= 0 and body[quote - n - 1] == 0x5C:  # backslash
        n += 1
    return n % 2 == 1


_ALLOWED = np.zeros(256, np.bool_)
_ALLOWED[list(_NUMBER_BYTES)] = True
_DEPTH = np.zeros(256, np.int64)
_DEPTH[ord("[")], _DEPTH[ord("]")] = 1, -1


def _array_end(body: bytes | bytearray, start: int) -> Steps[tuple[int | None, bool]]:
    """The index past the `]` that closes the `[` at `start`, if only number-array bytes lie in
    between (else None), and whether it nests lists. A step of text per numpy call."""
    pos = start + 1
    while pos < len(body):  # flat, the common case: no bracket arithmetic, a window at a time
        yield
        stop = min(pos + STEP_BYTES, len(body))
        close = body.find(b"]", pos, stop)
        upto = stop if close < 0 else close
        if body.find(b"[", pos, upto) >= 0:
            break  # nested
        if body[pos:upto].translate(None, _NUMBER_BYTES):
            return None, False
        if close >= 0:
            return close + 1, False
        pos = stop
    else:
        return None, False
    depth, pos = 0, start
    while pos < len(body):
        yield
        window = np.frombuffer(body, np.uint8, count=min(STEP_BYTES, len(body) - pos), offset=pos)
        levels = np.cumsum(_DEPTH[window]) + depth
        closed = np.flatnonzero(levels == 0)
        bad = np.flatnonzero(~_ALLOWED[window])
        first_close = int(closed[0]) if closed.size else None
        if bad.size and (first_close is None or bad[0] < first_close):
            return None, True
        if first_close is not None:
            return pos + first_close + 1, True
        depth, pos = int(levels[-1]), pos + len(window)
    return None, True
