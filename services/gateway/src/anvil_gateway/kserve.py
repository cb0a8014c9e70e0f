"""KServe v2 / Open Inference Protocol requests: JSON data, binary tensors, shared-memory references.

Everything a client sends is checked here, before it reaches a queue: the type of every field, the
datatype, byte counts against shapes, binary section sizes, shared-memory bounds. Errors raise
`BadRequest` (or `ShmError`) with the constraint; regions pinned so far are released first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from anvil_core.tensors import DATATYPES, HostTensor, TensorError
from anvil_gateway import json_bulk, json_codec
from anvil_gateway.json_tensors import MAX_RANK, BadRequest, bulk_tensor_steps, json_data_to_tensor
from anvil_gateway.sysshm import Region, SystemShm

__all__ = [
    "BINARY_BYTES_PER_COST",
    "BadRequest",
    "OutputRequest",
    "ParsedRequest",
    "answer_cost",
    "json_document_steps",
    "parse_cost",
    "parse_json_document",
    "parse_json_request",
    "parse_request",
    "release_all",
    "shm_ref",
]

MAX_TENSORS = 64


@dataclass
class OutputRequest:
    """What the client asked of one output: binary or JSON data, or a shared-memory destination."""

    name: str
    binary: bool | None = None  # None: follow the request's binary_data_output
    shm: tuple[str, int, int] | None = None  # (region, offset, byte_size)


@dataclass
class ParsedRequest:
    id: str | None
    inputs: list[HostTensor]
    outputs: list[OutputRequest]
    parameters: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)  # pinned; release after the answer
    tenant: str = "default"  # whose shared-memory regions the request may name

    def region(self, name: str) -> Region:
        """A region this request pinned (so still registered)."""
        return next(r for r in self.regions if r.name == name)

    @property
    def binary_output(self) -> bool:
        return self.parameters.get("binary_data_output") is True


def parse_json_document(body: bytes | bytearray | memoryview, bulk: bool = False) -> dict[str, Any]:
    """The body's JSON object. `bulk` (large bodies, on a parse thread): large number arrays that
    are the `data` of an input are left as `json_bulk.NumberArray`s, converted later in steps."""
    raw = body if isinstance(body, bytes | bytearray) else bytes(body)  # no copy of a whole body
    try:
        if bulk:
            doc = json_bulk.loads(raw)
            if isinstance(doc, dict):
                doc = _materialize_but_inputs_data(doc)
        else:
            doc = json_codec.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _bad_json(exc) from None
    return _object(doc)


def _bad_json(exc: Exception) -> BadRequest:
    """What a body that does not parse is told (one wording for the whole and the stepped parse)."""
    if isinstance(exc, RecursionError):
        return BadRequest("JSON nested too deeply")
    return BadRequest(f"body is not valid JSON: {exc}")


def _object(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


def json_document_steps(body: bytes | bytearray | memoryview) -> json_bulk.Steps[dict[str, Any]]:
    """`parse_json_document(body, bulk=True)` as steps (the event loop runs other tasks between
    them: `request_path.run_steps`), and the large number arrays of inputs that carry their data in
    JSON converted to their tensors, a step at a time; `parse_request(..., doc=)` takes the result."""
    raw = body if isinstance(body, bytes | bytearray) else bytes(body)
    try:
        doc = yield from json_bulk.loads_steps(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _bad_json(exc) from None
    doc = _materialize_but_inputs_data(_object(doc))
    inputs = doc.get("inputs")
    for i, raw_input in enumerate(inputs[:MAX_TENSORS] if isinstance(inputs, list) else ()):
        if not isinstance(raw_input, dict) or not isinstance(raw_input.get("data"), json_bulk.NumberArray):
            continue
        params = raw_input.get("parameters")
        if isinstance(params, dict) and ("binary_data_size" in params or "shared_memory_region" in params):
            continue  # its data is not what is read (`_parse_input`)
        where = f"inputs[{i}]"
        name, datatype, shape = parse_tensor_header(raw_input, where)
        raw_input["data"] = yield from bulk_tensor_steps(name, datatype, shape, raw_input["data"], where)
    return doc


def _materialize_but_inputs_data(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: json_bulk.materialize(v) for k, v in doc.items() if k != "inputs"}
    if "inputs" in doc:
        inputs = doc["inputs"]
        out["inputs"] = (
            [
                {k: v if k == "data" else json_bulk.materialize(v) for k, v in i.items()}
                if isinstance(i, dict)
                else json_bulk.materialize(i)
                for i in inputs
            ]
            if isinstance(inputs, list)
            else json_bulk.materialize(inputs)
        )
    return out


def split_body(
    body: bytes | bytearray, header_length: str | None
) -> tuple[bytes | bytearray | memoryview, memoryview]:
    """The JSON header and the binary section, per `Inference-Header-Content-Length`."""
    view = memoryview(body)
    if header_length is None:
        return body, view[len(view) :]
    text = header_length.strip()
    if not text.isdigit() or int(text) > len(body):
        raise BadRequest(
            f"Inference-Header-Content-Length must be an integer within the body's {len(body)} bytes, "
            f"got {header_length[:32]!r}"
        )
    n = int(text)
    return view[:n], view[n:]


# Parsing a binary section is a view and a size check, copying it (an answer's) one memcpy: a
# byte of it costs about this many times less than a byte of JSON text (`parse_cost`).
BINARY_BYTES_PER_COST = 32


def parse_cost(size: int, header_length: str | None) -> int:
    """The work of parsing a body of `size` bytes, in bytes of JSON text: the JSON header's length
    plus the binary section's bytes / BINARY_BYTES_PER_COST (its tensors are views of the body,
    never walked). A malformed header length counts the whole body (its parse refuses it at once)."""
    text = (header_length or "").strip()
    if not text.isdigit() or int(text) > size:
        return size
    head = int(text)
    return head + (size - head) // BINARY_BYTES_PER_COST


def answer_cost(parsed: ParsedRequest, outputs: list[HostTensor], json_bytes_per_number: int) -> int:
    """The work of encoding `outputs` as `parsed` asked, in bytes of JSON text (as `parse_cost`):
    `json_bytes_per_number` per element of a JSON output, a binary or shared-memory output's bytes
    / BINARY_BYTES_PER_COST (one copy)."""
    asked = {o.name: o for o in parsed.outputs}
    cost = 0
    for t in outputs:
        req = asked.get(t.name)
        raw = (req is not None and req.shm is not None) or (
            parsed.binary_output if req is None or req.binary is None else req.binary
        )
        cost += t.nbytes // BINARY_BYTES_PER_COST if raw else json_bytes_per_number * t.data.size
    return cost


def parse_json_request(body: bytes) -> ParsedRequest:
    """A request with JSON data only (no binary section, no shared memory)."""
    return parse_request(body, None, None)


def parse_request(
    body: bytes | bytearray,
    header_length: str | None,
    shm: SystemShm | None,
    tenant: str = "default",
    bulk: bool = False,
    doc: dict[str, Any] | None = None,
) -> ParsedRequest:
    """Parse and check a request. `tenant` owns the shared-memory regions it may name; `bulk`: a
    large body on a parse thread (`parse_json_document`); `doc`: the JSON header already parsed
    (`json_document_steps`, on the event loop). Thread-safe."""
    head, binary = split_body(body, header_length)
    if doc is None:
        doc = parse_json_document(head, bulk)
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest("'id' must be a string")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    if len(raw_inputs) > MAX_TENSORS:
        raise BadRequest(f"at most {MAX_TENSORS} inputs per request")
    parsed = ParsedRequest(req_id, [], [], _params(doc.get("parameters"), "parameters"), tenant=tenant)
    try:
        pos = 0
        for i, raw in enumerate(raw_inputs):
            tensor, used = _parse_input(i, raw, binary[pos:], shm, parsed)
            parsed.inputs.append(tensor)
            pos += used
        if pos != len(binary):
            raise BadRequest(
                f"binary section holds {len(binary)} bytes but the inputs' binary_data_size add up to {pos}"
            )
        parsed.outputs = _parse_outputs(doc.get("outputs", []), shm, parsed)
    except BaseException:
        release_all(parsed, shm)
        raise
    return parsed


def release_all(parsed: ParsedRequest, shm: SystemShm | None) -> None:
    if shm is not None:
        for region in parsed.regions:
            shm.release(region)
    parsed.regions.clear()


def _params(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"'{where}' must be an object")
    return raw


def _nonneg_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse_shape(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_RANK:
        raise BadRequest(f"{where}.shape must be a list of at most {MAX_RANK} integers")
    if not all(_nonneg_int(d) for d in raw):
        raise BadRequest(f"{where}.shape must hold non-negative integers, got {raw}")
    return tuple(raw)


def parse_tensor_header(raw: Any, where: str) -> tuple[str, str, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be a non-empty string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:  # a list or dict isn't hashable
        raise BadRequest(f"{where}.datatype must be one of {', '.join(DATATYPES)}, got {datatype!r}")
    return name, str(datatype), parse_shape(raw.get("shape"), where)


def _parse_input(
    i: int, raw: Any, binary: memoryview, shm: SystemShm | None, parsed: ParsedRequest
) -> tuple[HostTensor, int]:
    """One input tensor and how many bytes of the binary section it consumed."""
    where = f"inputs[{i}]"
    name, datatype, shape = parse_tensor_header(raw, where)
    params = _params(raw.get("parameters"), f"{where}.parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if not _nonneg_int(size):
            raise BadRequest(f"{where}.parameters.binary_data_size must be a non-negative integer")
        if size > len(binary):
            raise BadRequest(
                f"{where} ({name}): binary_data_size {size} exceeds the {len(binary)} bytes left"
            )
        return _from_bytes(name, datatype, shape, binary[:size], where), size
    ref = shm_ref(params, where, shm, parsed)
    if ref is not None:
        data = parsed.regions[-1].read(ref[1], ref[2], where)
        return _from_bytes(name, datatype, shape, memoryview(data), where), 0
    if "data" not in raw:
        raise BadRequest(f"{where} ({name}) has no 'data', binary_data_size or shared_memory_region")
    return json_data_to_tensor(name, datatype, shape, raw["data"], where), 0


def _from_bytes(name: str, datatype: str, shape: tuple[int, ...], raw: memoryview, where: str) -> HostTensor:
    try:
        return HostTensor.from_buffer(name, datatype, shape, raw)
    except TensorError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def _parse_outputs(raw_outputs: Any, shm: SystemShm | None, parsed: ParsedRequest) -> list[OutputRequest]:
    if not isinstance(raw_outputs, list) or len(raw_outputs) > MAX_TENSORS:
        raise BadRequest(f"'outputs' must be a list of at most {MAX_TENSORS} objects")
    outputs = []
    for i, out in enumerate(raw_outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a string 'name'")
        params = _params(out.get("parameters"), f"outputs[{i}].parameters")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadRequest(f"outputs[{i}].parameters.binary_data must be true or false")
        outputs.append(OutputRequest(out["name"], binary, shm_ref(params, f"outputs[{i}]", shm, parsed)))
    return outputs


def shm_ref(
    params: dict[str, Any], where: str, shm: SystemShm | None, parsed: ParsedRequest
) -> tuple[str, int, int] | None:
    """(region, offset, size) of a shared-memory reference, pinned and bounds-checked; None if absent."""
    region_name = params.get("shared_memory_region")
    if region_name is None:
        return None
    if shm is None:
        raise BadRequest(f"{where}: shared memory is not accepted here")
    size: Any = params.get("shared_memory_byte_size")
    offset: Any = params.get("shared_memory_offset", 0)
    if not isinstance(region_name, str):
        raise BadRequest(f"{where}.parameters.shared_memory_region must be a string")
    if not _nonneg_int(size) or not _nonneg_int(offset):
        raise BadRequest(
            f"{where}: shared_memory_byte_size and shared_memory_offset must be non-negative integers"
        )
    region = shm.acquire(parsed.tenant, region_name)
    parsed.regions.append(region)
    region.check(int(offset), int(size), where)  # bounds check now, before anything is queued
    return region_name, int(offset), int(size)
