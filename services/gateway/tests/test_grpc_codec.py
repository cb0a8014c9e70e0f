"""gRPC ModelInferRequest parsing and ModelInferResponse encoding (grpc_codec.py), and the HTTP
status -> gRPC code table (grpc_status.py): the same checks and messages as the HTTP parser."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from anvil_core.tensors import HostTensor
from anvil_gateway.grpc_codec import encode_response, parse_infer_request
from anvil_gateway.grpc_status import code_of
from anvil_gateway.json_tensors import BadRequest
from anvil_gateway.kserve import OutputRequest, ParsedRequest, release_all
from anvil_gateway.proto_gen import grpc_service_pb2 as pb
from anvil_gateway.sysshm import ShmError, SystemShm


def _request(*inputs: tuple[str, str, list[int]], raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="r1")
    for name, datatype, shape in inputs:
        req.inputs.add(name=name, datatype=datatype, shape=shape)
    req.raw_input_contents.extend(raw or [])
    return req


def test_raw_contents_become_the_tensors_bytes() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[1, 2]], dtype=np.int64)
    req = _request(("x", "FP32", [2, 3]), ("ids", "INT64", [1, 2]), raw=[x.tobytes(), ids.tobytes()])
    req.parameters["priority"].uint64_param = 1  # as tritonclient sends it
    req.parameters["timeout"].int64_param = 5000
    parsed = parse_infer_request(req, None)
    np.testing.assert_array_equal(parsed.inputs[0].data, x)
    np.testing.assert_array_equal(parsed.inputs[1].data, ids)
    assert parsed.parameters == {"priority": 1, "timeout": 5000} and parsed.id == "r1"


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("FP32", "fp32_contents", [0.5, -1.25, 3.0, 4.0]),
        ("FP64", "fp64_contents", [0.1, 0.2, 0.3, 1e300]),
        ("INT8", "int_contents", [-128, 0, 5, 127]),
        ("UINT8", "uint_contents", [0, 1, 2, 255]),
        ("INT64", "int64_contents", [-(2**62), 0, 1, 2**62]),
        ("BOOL", "bool_contents", [True, False, True, True]),
        ("BYTES", "bytes_contents", [b"a", b"", b"xyz", b"\x00"]),
    ],
)
def test_typed_contents_of_every_family(datatype: str, field: str, values: list[object]) -> None:
    req = _request(("x", datatype, [2, 2]))
    getattr(req.inputs[0].contents, field).extend(values)
    t = parse_infer_request(req, None).inputs[0]
    assert t.datatype == datatype and t.shape == (2, 2)
    assert t.data.reshape(-1).tolist() == [np.float32(v) if datatype == "FP32" else v for v in values]


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda r: r.inputs[0].contents.int_contents.extend([1, 2, 3, 300]), "outside INT8's range"),
        (lambda r: r.inputs[0].contents.fp32_contents.extend([1.0] * 4), "goes in contents.int_contents"),
        (lambda r: r.inputs[0].contents.int_contents.extend([1, 2]), "holds 2 values; shape [2, 2] needs 4"),
        (lambda r: None, "has no contents, raw_input_contents entry or shared_memory_region"),
        (lambda r: r.parameters["priority"].Clear() or r.parameters["priority"], "holds no value"),
    ],
)
def test_bad_typed_contents_are_400s_stating_the_constraint(build: object, says: str) -> None:
    req = _request(("x", "INT8", [2, 2]))
    build(req)  # type: ignore[operator]
    with pytest.raises(BadRequest, match=re.escape(says)):
        parse_infer_request(req, None)


def test_half_floats_are_raw_only() -> None:
    req = _request(("x", "FP16", [1, 2]))
    req.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(BadRequest, match="FP16 has no typed contents; send it in raw_input_contents"):
        parse_infer_request(req, None)
    ok = _request(("x", "FP16", [1, 2]), raw=[np.array([[1, 2]], np.float16).tobytes()])
    assert parse_infer_request(ok, None).inputs[0].data.tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize(
    ("raw", "typed", "says"),
    [
        ([b"\x00" * 8], True, "contents must be empty when raw_input_contents is used"),
        ([b"\x00" * 8, b"\x00" * 8], False, "2 entries but 1 inputs"),
        ([b"\x00" * 7], False, "7 bytes given but shape [1, 2] of FP32 needs 8"),
    ],
)
def test_raw_contents_misuse(raw: list[bytes], typed: bool, says: str) -> None:
    req = _request(("x", "FP32", [1, 2]), raw=raw)
    if typed:
        req.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(BadRequest, match=re.escape(says)):
        parse_infer_request(req, None)


@pytest.mark.parametrize(
    ("shape", "datatype", "says"),
    [
        ([1, -2], "FP32", "non-negative"),
        ([1] * 40, "FP32", "at most"),
        ([1], "FP8", "datatype must be one of"),
    ],
)
def test_tensor_headers_are_checked_as_over_http(shape: list[int], datatype: str, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        parse_infer_request(_request(("x", datatype, shape), raw=[b""]), None)
    with pytest.raises(BadRequest, match="non-empty list"):
        parse_infer_request(pb.ModelInferRequest(model_name="m"), None)


@pytest.fixture
def shm() -> Iterator[tuple[SystemShm, str, int]]:
    """A registered 256-byte region 'r' (0600 object in /dev/shm) of tenant 'default'."""
    key = f"anvil-grpc-codec-{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 256)
    table = SystemShm(True)
    table.register("default", "r", "/" + key, 0, 256)
    yield table, key, fd
    table.unregister("default")
    os.close(fd)
    os.unlink(f"/dev/shm/{key}")


def test_shared_memory_inputs_and_outputs(shm: tuple[SystemShm, str, int]) -> None:
    table, _, fd = shm
    x = np.arange(4, dtype=np.float32)
    os.pwrite(fd, x.tobytes(), 16)
    req = _request(("x", "FP32", [1, 4]), ("y", "FP32", [1, 1]), raw=[np.float32([[7]]).tobytes()])
    p = req.inputs[0].parameters
    p["shared_memory_region"].string_param = "r"
    p["shared_memory_byte_size"].int64_param = 16
    p["shared_memory_offset"].int64_param = 16
    out = req.outputs.add(name="a")
    out.parameters["shared_memory_region"].string_param = "r"
    out.parameters["shared_memory_byte_size"].int64_param = 16
    out.parameters["shared_memory_offset"].int64_param = 64
    req.outputs.add(name="b")
    parsed = parse_infer_request(req, table)
    np.testing.assert_array_equal(parsed.inputs[0].data, x.reshape(1, 4))
    assert parsed.inputs[1].data.tolist() == [[7.0]] and table.regions[("default", "r")].users == 2
    a, b = (
        HostTensor.from_array("a", "FP32", x[::-1].reshape(1, 4)),
        HostTensor.from_array("b", "INT32", [[5]]),
    )
    resp = encode_response("m", "1", parsed, [a, b])
    assert os.pread(fd, 16, 64) == x[::-1].tobytes()
    # the shm output keeps its place so tritonclient's raw index of "b" is right
    assert list(resp.raw_output_contents) == [b"", np.int32([[5]]).tobytes()]
    assert [o.name for o in resp.outputs] == ["a", "b"] and list(resp.outputs[0].shape) == [1, 4]
    release_all(parsed, table)
    assert table.regions[("default", "r")].users == 0


def test_unregistered_region_and_out_of_bounds_release_what_was_pinned(
    shm: tuple[SystemShm, str, int],
) -> None:
    table, _, _ = shm
    req = _request(("x", "FP32", [1, 4]), ("y", "FP32", [1, 4]))
    for t, region, offset in ((req.inputs[0], "r", 0), (req.inputs[1], "r", 250)):
        t.parameters["shared_memory_region"].string_param = region
        t.parameters["shared_memory_byte_size"].int64_param = 16
        t.parameters["shared_memory_offset"].int64_param = offset
    with pytest.raises(ShmError, match="exceeds region 'r' of 256 bytes"):
        parse_infer_request(req, table)
    req.inputs[1].parameters["shared_memory_region"].string_param = "nope"
    with pytest.raises(ShmError, match="'nope' is not registered"):
        parse_infer_request(req, table)
    assert table.regions[("default", "r")].users == 0
    with pytest.raises(BadRequest, match="shared memory is not accepted here"):
        parse_infer_request(req, None)


def test_trailing_shm_outputs_add_no_raw_entry_and_too_small_is_refused(
    shm: tuple[SystemShm, str, int],
) -> None:
    table, _, _ = shm
    parsed = ParsedRequest("7", [], [OutputRequest("a", True, ("r", 0, 8))])
    parsed.regions.append(table.acquire("default", "r"))
    a = HostTensor.from_array("a", "FP32", np.ones((1, 2), np.float32))
    resp = encode_response("m", "", parsed, [a])
    assert list(resp.raw_output_contents) == [] and resp.id == "7" and resp.model_version == "1"
    with pytest.raises(BadRequest, match="needs 12 bytes; shared_memory_byte_size is 8"):
        encode_response("m", "1", parsed, [HostTensor.from_array("a", "FP32", np.ones((1, 3), np.float32))])
    table.release(parsed.regions[0])


def test_tritonclient_reads_our_answer() -> None:
    grpc_result = pytest.importorskip("tritonclient.grpc")
    triton_pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    outs = [
        HostTensor.from_array("f", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
        HostTensor.from_array("s", "BYTES", np.array([b"ab", b"c"], dtype=object)),
    ]
    ours = encode_response("m", "3", ParsedRequest(None, [], []), outs)
    result = grpc_result.InferResult(triton_pb.ModelInferResponse.FromString(ours.SerializeToString()))
    np.testing.assert_array_equal(result.as_numpy("f"), outs[0].data)
    assert result.as_numpy("s").tolist() == [b"ab", b"c"]
    assert result.get_response().model_version == "3"


def test_status_codes_follow_triton() -> None:
    table = {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        413: "RESOURCE_EXHAUSTED",
        429: "UNAVAILABLE",
        499: "CANCELLED",
        500: "INTERNAL",
        501: "UNIMPLEMENTED",
        503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
        418: "INVALID_ARGUMENT",  # any other 4xx
        599: "INTERNAL",
    }
    assert {s: code_of(s).name for s in table} == table
    assert code_of(409, {409: grpc.StatusCode.FAILED_PRECONDITION}) is grpc.StatusCode.FAILED_PRECONDITION
