"""KServe v2 JSON tensor data: the `data` arrays of requests and responses."""

from __future__ import annotations

import json
from itertools import chain
from typing import Any

import numpy as np

from anvil_core.tensors import DATATYPES, HostTensor, element_count
from anvil_gateway.json_bulk import NumberArray, Steps, drain

__all__ = ["MAX_RANK", "BadRequest", "bulk_tensor_steps", "json_data_to_tensor", "tensor_to_json"]

MAX_RANK = 16


class BadRequest(ValueError):
    """The request breaks the protocol or the model's contract; the message states the constraint."""


def json_data_to_tensor(
    name: str, datatype: str, shape: tuple[int, ...], data: Any, where: str
) -> HostTensor:
    """Turn a JSON 'data' list (flat or nested, row-major) into a tensor of `shape`. `data` may be
    the tensor `bulk_tensor_steps` made of this input's data already (never a value out of JSON)."""
    if isinstance(data, HostTensor):
        return data
    if isinstance(data, NumberArray):
        return drain(bulk_tensor_steps(name, datatype, shape, data, where))
    count = element_count(shape)
    flat, types = _flatten(data, where)
    if len(flat) != count:
        raise BadRequest(f"{where} ({name}): {len(flat)} values given, shape {list(shape)} needs {count}")
    # `types` (the exact types of the values) answers the usual cases at C speed; isinstance over
    # every value decides the rest (subclasses: never out of JSON, possible from a caller).
    try:
        if datatype == "BYTES":
            if not types <= {str} and not all(isinstance(v, str) for v in flat):
                raise BadRequest(f"{where} ({name}): BYTES data must be strings")
            arr = np.array([v.encode() for v in flat], dtype=object).reshape(shape)
        elif datatype == "BOOL":
            if not types <= {bool} and not all(isinstance(v, bool) for v in flat):
                raise BadRequest(f"{where} ({name}): BOOL data must be true/false")
            arr = np.array(flat, dtype=np.bool_).reshape(shape)
        else:
            if not types <= {int, float} and not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in flat
            ):
                raise BadRequest(f"{where} ({name}): {datatype} data must be numbers")
            if datatype == "BF16":
                f32 = np.array(flat, dtype=np.float32).reshape(shape)
                arr = (f32.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bf16 bits
            else:
                dtype = DATATYPES[datatype]
                assert dtype is not None
                if dtype.kind in "iu" and not _ints_within(flat, types, np.iinfo(dtype)):
                    raise BadRequest(f"{where} ({name}): values must be integers within {datatype}'s range")
                arr = np.array(flat, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError) as exc:
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(f"{where} ({name}): data does not convert to {datatype}: {exc}") from None
    return HostTensor(name, datatype, shape, arr)


def bulk_tensor_steps(
    name: str, datatype: str, shape: tuple[int, ...], data: NumberArray, where: str
) -> Steps[HostTensor]:
    """A large array cut out of the body (json_bulk): converted a step at a time (yielding between
    steps), each step checked as a whole `data` list is; more values than the shape holds stop it
    at once."""
    count = element_count(shape)
    parts: list[np.ndarray] = []
    given = 0
    try:
        for values in data.steps():
            yield
            given += len(values)
            if given > count:
                raise BadRequest(
                    f"{where} ({name}): more than {count} values given, shape {list(shape)} needs {count}"
                )
            parts.append(json_data_to_tensor(name, datatype, (len(values),), values, where).data)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {where}.data: {exc}") from None
    if given != count:
        raise BadRequest(f"{where} ({name}): {given} values given, shape {list(shape)} needs {count}")
    if not parts:  # an empty shape: the plain path makes its (0,) array
        return json_data_to_tensor(name, datatype, shape, [], where)
    arr = parts[0] if len(parts) == 1 else np.concatenate(parts)  # (count,) of the carrier dtype
    return HostTensor(name, datatype, shape, arr.reshape(shape))


def _ints_within(flat: list[Any], types: set[type], info: np.iinfo) -> bool:
    """Whether every value is an integer within `info`'s range (float 3.0 counts as an integer)."""
    if types <= {int} and (not flat or (min(flat) >= info.min and max(flat) <= info.max)):
        return True
    # floats, or a value out of range: value by value, so a huge one raises OverflowError as before
    return not any(not float(v).is_integer() or v < info.min or v > info.max for v in flat)


def _flatten(data: Any, where: str) -> tuple[list[Any], set[type]]:
    """The values of `data` in row-major order, and their exact types.

    A level that holds only lists is flattened in one C call; a level that mixes lists with
    values (a ragged or malformed body) goes value by value. Either way, a list found at rank
    MAX_RANK + 1 or deeper is refused.
    """
    if not isinstance(data, list):
        raise BadRequest(f"{where}.data must be a list")
    level, rank = data, 1
    while True:
        types = set(map(type, level))
        if types == {list}:
            if rank > MAX_RANK:
                raise BadRequest(f"{where}.data nested deeper than {MAX_RANK}")
            level, rank = list(chain.from_iterable(level)), rank + 1
        elif any(issubclass(t, list) for t in types):
            flat = _flatten_mixed(data, where)
            return flat, set(map(type, flat))
        else:
            return level, types


def _flatten_mixed(data: list[Any], where: str) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > MAX_RANK:
                    raise BadRequest(f"{where}.data nested deeper than {MAX_RANK}")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def tensor_to_json(t: HostTensor) -> dict[str, Any]:
    """A v2 output tensor as JSON: `data` is flat, a list of str for BYTES, else an ndarray that
    `json_codec.dumps` writes as its `tolist()` (BF16 as the float32 numbers it stands for)."""
    if t.datatype == "BYTES":
        data: Any = [
            v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in t.data.reshape(-1)
        ]
    elif t.datatype == "BF16":
        data = (t.data.astype(np.uint32) << 16).view(np.float32).reshape(-1)
    else:
        data = t.data.reshape(-1)
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": data}
