"""KServe v2 JSON tensor data: the `data` arrays of requests and responses."""

from __future__ import annotations

from typing import Any

import numpy as np

from anvil_core.tensors import DATATYPES, HostTensor, element_count

__all__ = ["MAX_RANK", "BadRequest", "json_data_to_tensor", "tensor_to_json"]

MAX_RANK = 16


class BadRequest(ValueError):
    """The request breaks the protocol or the model's contract; the message states the constraint."""


def json_data_to_tensor(
    name: str, datatype: str, shape: tuple[int, ...], data: Any, where: str
) -> HostTensor:
    """Turn a JSON 'data' list (flat or nested, row-major) into a tensor of `shape`."""
    count = element_count(shape)
    flat = _flatten(data, where)
    if len(flat) != count:
        raise BadRequest(f"{where} ({name}): {len(flat)} values given, shape {list(shape)} needs {count}")
    try:
        if datatype == "BYTES":
            if not all(isinstance(v, str) for v in flat):
                raise BadRequest(f"{where} ({name}): BYTES data must be strings")
            arr = np.array([v.encode() for v in flat], dtype=object).reshape(shape)
        elif datatype == "BOOL":
            if not all(isinstance(v, bool) for v in flat):
                raise BadRequest(f"{where} ({name}): BOOL data must be true/false")
            arr = np.array(flat, dtype=np.bool_).reshape(shape)
        else:
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
                raise BadRequest(f"{where} ({name}): {datatype} data must be numbers")
            if datatype == "BF16":
                f32 = np.array(flat, dtype=np.float32).reshape(shape)
                arr = (f32.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bf16 bits
            else:
                dtype = DATATYPES[datatype]
                assert dtype is not None
                if dtype.kind in "iu":
                    info = np.iinfo(dtype)
                    if any(not float(v).is_integer() or v < info.min or v > info.max for v in flat):
                        raise BadRequest(
                            f"{where} ({name}): values must be integers within {datatype}'s range"
                        )
                arr = np.array(flat, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError) as exc:
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(f"{where} ({name}): data does not convert to {datatype}: {exc}") from None
    return HostTensor(name, datatype, shape, arr)


def _flatten(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise BadRequest(f"{where}.data must be a list")
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
    if t.datatype == "BYTES":
        data: list[Any] = [
            v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in t.data.reshape(-1)
        ]
    elif t.datatype == "BF16":
        data = (t.data.astype(np.uint32) << 16).view(np.float32).reshape(-1).tolist()
    else:
        data = t.data.reshape(-1).tolist()
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": data}
