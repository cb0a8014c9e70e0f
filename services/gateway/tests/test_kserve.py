"""KServe v2 JSON parsing: every malformed request becomes BadRequest naming the constraint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from anvil_gateway.kserve import BadRequest, encode_response, parse_json_request


def _body(**inp: object) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}
    tensor.update(inp)
    return json.dumps({"inputs": [tensor]}).encode()


def test_flat_and_nested_data_parse_alike() -> None:
    flat = parse_json_request(_body())
    nested = parse_json_request(_body(data=[[1, 2], [3, 4]]))
    np.testing.assert_array_equal(flat.inputs[0].data, nested.inputs[0].data)
    assert flat.inputs[0].data.dtype == np.float32 and flat.inputs[0].shape == (2, 2)


@pytest.mark.parametrize(
    ("datatype", "data", "dtype"),
    [
        ("INT8", [1, -2], np.int8),
        ("UINT8", [0, 255], np.uint8),
        ("INT64", [1, 2], np.int64),
        ("BOOL", [True, False], np.bool_),
        ("FP16", [0.5, 1.5], np.float16),
        ("BF16", [1.0, 2.0], np.uint16),
    ],
)
def test_datatypes(datatype: str, data: list[object], dtype: type) -> None:
    got = parse_json_request(_body(datatype=datatype, shape=[2], data=data)).inputs[0]
    assert got.data.dtype == dtype


def test_bytes_inputs_become_byte_strings() -> None:
    got = parse_json_request(_body(datatype="BYTES", shape=[2], data=["hi", "é"])).inputs[0]
    assert list(got.data) == [b"hi", "é".encode()]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{bad", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b"{}", "'inputs' must be a non-empty list"),
        (_body(data=[1, 2, 3]), "3 values given, shape \\[2, 2\\] needs 4"),
        (_body(datatype="FP8"), "datatype must be one of"),
        (_body(shape=[2, -1]), "non-negative integers"),
        (_body(shape="2x2"), "shape must be a list"),
        (_body(data=["a", "b", "c", "d"]), "must be numbers"),
        (_body(datatype="INT8", shape=[1], data=[300]), "within INT8's range"),
        (_body(datatype="INT32", shape=[1], data=[1.5]), "integers"),
        (_body(datatype="BOOL", shape=[1], data=[1]), "true/false"),
        (_body(name=""), "name must be a non-empty string"),
        (_body(data=7), "data must be a list"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}).encode(), "no 'data'"),
        (json.dumps({"inputs": [], "id": 3}).encode(), "'id' must be a string"),
        (json.dumps({"inputs": [1]}).encode(), "must be an object"),
        (
            json.dumps(
                {
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                    "outputs": [{"nom": 1}],
                }
            ).encode(),
            "outputs\\[0\\]",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|JSON object"),
    ],
)
def test_malformed_requests_state_the_constraint(body: bytes, match: str) -> None:
    with pytest.raises(BadRequest, match=match):
        parse_json_request(body)


def test_deeply_nested_data_is_refused() -> None:
    data: list[object] = [1.0]
    for _ in range(40):
        data = [data]
    with pytest.raises(BadRequest, match="nested deeper"):
        parse_json_request(_body(shape=[1], data=data))


def test_response_encoding_is_kserve_shaped() -> None:
    from anvil_core.tensors import HostTensor

    out = HostTensor.from_array("y", "FP32", np.array([[1.5, 2.5]]))
    doc = encode_response("m", "1", "abc", [out])
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "id": "abc",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}],
    }
