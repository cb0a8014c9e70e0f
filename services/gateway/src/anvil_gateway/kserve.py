"""KServe v2 / Open Inference Protocol JSON: request parsing and response encoding.

Everything a client sends is checked here, before it reaches a queue: types of every field, the
datatype, the element count against the shape. Errors raise `BadRequest` with the constraint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from anvil_core.tensors import DATATYPES, HostTensor, TensorError, element_count

__all__ = ["BadRequest", "ParsedRequest", "encode_response", "parse_json_request", "tensor_to_json"]

MAX_TENSORS = 64
MAX_RANK = 16


class BadRequest(ValueError):
    """The request breaks the protocol or the model's contract; the message states the constraint."""


@dataclass
class ParsedRequest:
    id: str | None
    inputs: list[HostTensor]
    outputs: list[str]
    parameters: dict[str, Any] = field(default_factory=dict)


def parse_json_document(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


def parse_json_request(body: bytes) -> ParsedRequest:
    doc = parse_json_document(body)
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest("'id' must be a string")
    params = _params(doc.get("parameters"), "parameters")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    if len(raw_inputs) > MAX_TENSORS:
        raise BadRequest(f"at most {MAX_TENSORS} inputs per request")
    inputs = [_parse_input(i, raw) for i, raw in enumerate(raw_inputs)]
    outputs: list[str] = []
    raw_outputs = doc.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise BadRequest("'outputs' must be a list")
    for i, out in enumerate(raw_outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a string 'name'")
        outputs.append(out["name"])
    return ParsedRequest(req_id, inputs, outputs, params)


def _params(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"'{where}' must be an object")
    return raw


def parse_shape(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_RANK:
        raise BadRequest(f"{where}.shape must be a list of at most {MAX_RANK} integers")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise BadRequest(f"{where}.shape must hold non-negative integers, got {raw}")
    return tuple(raw)


def parse_tensor_header(raw: Any, where: str) -> tuple[str, str, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be a non-empty string")
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        raise BadRequest(f"{where}.datatype must be one of {', '.join(DATATYPES)}, got {datatype!r}")
    return name, datatype, parse_shape(raw.get("shape"), where)


def _parse_input(i: int, raw: Any) -> HostTensor:
    where = f"inputs[{i}]"
    name, datatype, shape = parse_tensor_header(raw, where)
    if "data" not in raw:
        raise BadRequest(f"{where} ({name}) has no 'data'")
    return json_data_to_tensor(name, datatype, shape, raw["data"], where)


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


def encode_response(
    model: str, version: str, req_id: str | None, outputs: list[HostTensor]
) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": model, "model_version": version or "1"}
    if req_id is not None:
        doc["id"] = req_id
    doc["outputs"] = [tensor_to_json(t) for t in outputs]
    return doc


def tensor_error(exc: TensorError) -> BadRequest:
    return BadRequest(str(exc))
