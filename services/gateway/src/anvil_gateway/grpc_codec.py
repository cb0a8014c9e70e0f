"""KServe v2 gRPC messages <-> the gateway's `ParsedRequest` and output tensors, checked as the HTTP
parser checks JSON (kserve.py): names, datatypes, shapes, byte counts, shared-memory references.
Errors raise `BadRequest` (or `ShmError`) stating the constraint; regions pinned so far are released.

Input data comes one of three ways per input, as in the protocol:

* ``raw_input_contents``: one bytes entry per input not in shared memory, in ``inputs`` order
  (little-endian, row-major; BYTES as u32 length + bytes per element). What tritonclient sends.
  When present, no input may carry typed ``contents`` (Triton's rule).
* typed ``contents``: the repeated field of the datatype's family (fp32_contents for FP32, ...),
  exactly as many elements as the shape holds, each within the datatype's range. FP16 and BF16 have
  no typed field: they are raw only.
* ``shared_memory_region`` / ``_byte_size`` / ``_offset`` parameters: a registered system shm region.

Answers carry ``raw_output_contents`` as Triton's do (tritonclient reads only those): entry i is
output i's bytes; an output written into shared memory has an empty entry when later outputs follow
(tritonclient indexes raw contents by output position) and none when it is last.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anvil_core.tensors import HostTensor, TensorError, element_count
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import (
    MAX_TENSORS,
    OutputRequest,
    ParsedRequest,
    parse_tensor_header,
    release_all,
    shm_ref,
)
from anvil_gateway.proto_gen import grpc_service_pb2 as pb
from anvil_gateway.sysshm import SystemShm

__all__ = ["encode_response", "param_values", "parse_infer_request"]

# typed contents field -> the dtype its values are read as (wide enough for every value it can hold)
_WIDE: dict[str, Any] = {
    "bool_contents": np.bool_,
    "int_contents": np.int64,
    "int64_contents": np.int64,
    "uint_contents": np.uint64,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}
# datatype -> (typed contents field, numpy dtype of the carrier array), for the datatypes the gateway
# serves (anvil_core.tensors.DATATYPES); FP16/BF16: raw only
_TYPED: dict[str, tuple[str, Any]] = {
    "BOOL": ("bool_contents", np.bool_),
    "INT8": ("int_contents", np.int8),
    "INT16": ("int_contents", np.int16),
    "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint8),
    "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
    "BYTES": ("bytes_contents", None),
}
_CONTENT_FIELDS = tuple(f.name for f in pb.InferTensorContents.DESCRIPTOR.fields)


def param_values(params: Any, where: str) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as the plain values the HTTP parser sees."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is None:
            raise BadRequest(f"{where}.parameters[{key!r}] holds no value")
        out[key] = getattr(p, which)
    return out


def parse_infer_request(
    req: pb.ModelInferRequest, shm: SystemShm | None, tenant: str = "default", bulk: bool = False
) -> ParsedRequest:
    """Parse and check a ModelInferRequest. `tenant` owns the shm regions it may name; `bulk` is
    the off-loop flag of `parse_off_loop` (nothing differs here). Thread-safe."""
    del bulk
    if not req.inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    if len(req.inputs) > MAX_TENSORS or len(req.outputs) > MAX_TENSORS:
        raise BadRequest(f"at most {MAX_TENSORS} inputs and {MAX_TENSORS} outputs per request")
    parsed = ParsedRequest(req.id or None, [], [], param_values(req.parameters, "request"), tenant=tenant)
    raw = req.raw_input_contents
    try:
        used = 0
        for i, t in enumerate(req.inputs):
            where = f"inputs[{i}]"
            name, datatype, shape = parse_tensor_header(
                {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}, where
            )
            params = param_values(t.parameters, where)
            ref = shm_ref(params, where, shm, parsed)
            if ref is not None:
                data = parsed.regions[-1].read(ref[1], ref[2], where)
                parsed.inputs.append(_from_bytes(name, datatype, shape, data, where))
            elif raw:
                if t.HasField("contents"):
                    raise BadRequest(
                        f"{where} ({name}): contents must be empty when raw_input_contents is used"
                    )
                if used >= len(raw):
                    raise BadRequest(
                        f"raw_input_contents has {len(raw)} entries, fewer than the inputs not in "
                        "shared memory"
                    )
                parsed.inputs.append(_from_bytes(name, datatype, shape, raw[used], where))
                used += 1
            else:
                parsed.inputs.append(_typed(name, datatype, shape, t, where))
        if used != len(raw):
            raise BadRequest(
                f"raw_input_contents has {len(raw)} entries but {used} inputs are not in shared memory"
            )
        for i, o in enumerate(req.outputs):
            where = f"outputs[{i}]"
            if not o.name:
                raise BadRequest(f"{where}.name must be a non-empty string")
            params = param_values(o.parameters, where)
            parsed.outputs.append(OutputRequest(o.name, True, shm_ref(params, where, shm, parsed)))
    except BaseException:
        release_all(parsed, shm)
        raise
    return parsed


def _from_bytes(name: str, datatype: str, shape: tuple[int, ...], raw: bytes, where: str) -> HostTensor:
    try:
        return HostTensor.from_buffer(name, datatype, shape, raw)
    except TensorError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def _typed(
    name: str, datatype: str, shape: tuple[int, ...], t: pb.ModelInferRequest.InferInputTensor, where: str
) -> HostTensor:
    """An input from its typed contents: the datatype's field only, the shape's element count, each
    value within the datatype's range."""
    if not t.HasField("contents"):
        raise BadRequest(
            f"{where} ({name}) has no contents, raw_input_contents entry or shared_memory_region"
        )
    typed = _TYPED.get(datatype)
    if typed is None:
        raise BadRequest(f"{where} ({name}): {datatype} has no typed contents; send it in raw_input_contents")
    field, dtype = typed
    others = [f for f in _CONTENT_FIELDS if f != field and len(getattr(t.contents, f))]
    if others:
        raise BadRequest(f"{where} ({name}): {datatype} data goes in contents.{field}, got {others}")
    values = getattr(t.contents, field)
    try:
        count = element_count(shape)
    except TensorError as exc:
        raise BadRequest(f"{where}: {exc}") from None
    if len(values) != count:
        raise BadRequest(
            f"{where} ({name}): contents.{field} holds {len(values)} values; "
            f"shape {list(shape)} needs {count}"
        )
    if dtype is None:  # BYTES
        return HostTensor(name, datatype, shape, np.array(list(values), dtype=object).reshape(shape))
    wide = np.fromiter(values, dtype=_WIDE[field], count=count)
    if count and np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        if int(wide.min()) < info.min or int(wide.max()) > info.max:
            raise BadRequest(
                f"{where} ({name}): a value is outside {datatype}'s range [{info.min}, {info.max}]"
            )
    return HostTensor(name, datatype, shape, wide.astype(dtype, copy=False).reshape(shape))


def encode_response(
    model: str, version: str, parsed: ParsedRequest, outputs: list[HostTensor]
) -> pb.ModelInferResponse:
    """The answer: every output's metadata and its raw bytes, or its bytes written into the shm
    region the request named (pinned by the request, so still registered)."""
    resp = pb.ModelInferResponse(model_name=model, model_version=version or "1", id=parsed.id or "")
    asked = {o.name: o for o in parsed.outputs}
    raw: list[bytes] = []
    last_raw = 0
    for t in outputs:
        resp.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        data = t.to_bytes_view()
        req = asked.get(t.name)
        if req is not None and req.shm is not None:
            region_name, offset, size = req.shm
            if len(data) > size:
                raise BadRequest(
                    f"output {t.name!r} needs {len(data)} bytes; shared_memory_byte_size is {size}"
                )
            parsed.region(region_name).write(offset, data, f"output {t.name!r}")
            raw.append(b"")
            continue
        raw.append(bytes(data))
        last_raw = len(raw)
    resp.raw_output_contents.extend(raw[:last_raw])
    return resp
