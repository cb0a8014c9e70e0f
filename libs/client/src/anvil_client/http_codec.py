"""KServe v2 infer requests and responses over HTTP, both ways with the binary tensor extension.

Pure functions (no I/O), shared by `Client` and `AsyncClient` (`anvil_client.http`).

Request body (Triton's binary tensor extension, what `tritonclient.http` sends)::

    JSON header  {"inputs": [{"name", "datatype", "shape", "parameters": {"binary_data_size": n}}],
                  "outputs": [{"name", "parameters": {"binary_data": true}}],
                  "parameters": {"binary_data_output": true, "priority": p, "timeout": µs}}
    then each input's raw bytes (C order; BYTES elements u32 LE length + bytes), in input order.
    Header `Inference-Header-Content-Length`: the JSON header's length in bytes.

Response: the same layout (JSON header with `binary_data_size` per output, then the bytes), or
plain JSON when the server answered without a binary section; an error is a non-2xx status with
`{"error": "..."}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from anvil_core.tensors import HostTensor, TensorError, kserve_datatype, numpy_dtype

__all__ = ["HEADER_LENGTH", "InferError", "decode_response", "encode_request"]

HEADER_LENGTH = "Inference-Header-Content-Length"


class InferError(Exception):
    """The server refused or failed a request (`status`: the HTTP status, 0 when the reply could not
    be read) or an input could not be encoded (`status` 400, nothing was sent)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


def encode_request(
    inputs: Mapping[str, Any],
    outputs: Sequence[str] = (),
    priority: int = 0,
    timeout_us: int = 0,
    datatypes: Mapping[str, str] | None = None,
    request_id: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """Headers and body of an infer request; inputs are array-likes, their datatype taken from the
    numpy dtype unless `datatypes` names it (BF16: pass the uint16 bit patterns and "BF16")."""
    named = datatypes or {}
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview | bytes] = []
    for name, value in inputs.items():
        arr = np.asarray(value)
        datatype = named.get(name) or kserve_datatype(arr.dtype)
        if datatype is None:
            raise InferError(400, f"input {name!r}: no KServe datatype for numpy {arr.dtype}; name one")
        try:
            tensor = HostTensor.from_array(name, datatype, arr)
        except (TensorError, ValueError, TypeError) as exc:
            raise InferError(400, f"input {name!r} as {datatype}: {exc}") from None
        raw = tensor.to_bytes_view()
        blobs.append(raw)
        entries.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(tensor.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
    doc: dict[str, Any] = {"inputs": entries}
    if request_id is not None:
        doc["id"] = request_id
    if outputs:
        doc["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    params: dict[str, Any] = {"binary_data_output": True}
    if priority:
        params["priority"] = priority
    if timeout_us:
        params["timeout"] = timeout_us
    doc["parameters"] = params
    head = json.dumps(doc, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return headers, b"".join([head, *blobs])


def _error_text(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:300].decode(errors="replace") or "(empty body)"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):  # the OpenAI-style routes' shape
        err = err.get("message")
    return str(err) if err is not None else str(doc)[:300]


def decode_response(status: int, headers: Mapping[str, str], body: bytes) -> dict[str, np.ndarray]:
    """The outputs of an infer response, by name; raises InferError for an error status or a reply
    whose header, shapes and byte counts disagree. Arrays own their memory (copies of the body)."""
    if not 200 <= status < 300:
        raise InferError(status, _error_text(body))
    length = headers.get(HEADER_LENGTH) or headers.get(HEADER_LENGTH.lower())
    try:
        head_len = len(body) if length is None else int(length)
        if not 0 <= head_len <= len(body):
            raise ValueError(f"{HEADER_LENGTH} {head_len} outside the {len(body)}-byte body")
        doc = json.loads(body[:head_len])
        return _outputs(doc, memoryview(body)[head_len:])
    except (ValueError, KeyError, TypeError, TensorError) as exc:
        raise InferError(0, f"unreadable infer response: {exc}") from None


def _outputs(doc: Any, binary: memoryview) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    pos = 0
    for entry in doc["outputs"]:
        name, datatype = str(entry["name"]), str(entry["datatype"])
        shape = tuple(int(d) for d in entry["shape"])
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if pos + int(size) > len(binary):
                raise ValueError(f"output {name!r}: {size} bytes declared, {len(binary) - pos} remain")
            raw = memoryview(bytearray(binary[pos : pos + int(size)]))  # a writable copy
            pos += int(size)
            out[name] = HostTensor.from_buffer(name, datatype, shape, raw).data
        else:  # JSON data, row-major
            dtype = numpy_dtype(datatype)
            data = entry["data"]
            if dtype is None:
                items = [d.encode() if isinstance(d, str) else bytes(d) for d in data]
                out[name] = np.array(items, dtype=object).reshape(shape)
            else:
                out[name] = np.asarray(data, dtype=dtype).reshape(shape)
    if pos != len(binary):
        raise ValueError(f"{len(binary) - pos} bytes after the last binary output")
    return out
