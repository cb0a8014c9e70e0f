"""KServe v2 JSON parsing: every malformed request becomes BadRequest naming the constraint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anvil_gateway.kserve import BadRequest, parse_json_request, parse_request


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
        (_body(datatype=["FP32"]), "datatype must be one of"),
        (_body(datatype=9223372036854775809), "datatype must be one of"),
        (_body(data=[[1, 2], 3]), "3 values given"),
        (_body(datatype="INT64", data=[1, 2, 3, -9223372036854775809]), "within INT64's range"),
        (_body(datatype="INT64", data=[1, 2, 3, 10**400]), "does not convert to INT64"),
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


def test_json_response_is_kserve_shaped() -> None:
    from anvil_core.tensors import HostTensor
    from anvil_gateway.responses import infer_response

    parsed = parse_json_request(_body())
    parsed.id = "abc"
    out = HostTensor.from_array("y", "FP32", np.array([[1.5, 2.5]]))
    resp = infer_response("m", "1", parsed, [out], None, {})
    assert json.loads(resp.body) == {
        "model_name": "m",
        "model_version": "1",
        "id": "abc",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}],
    }


def _binary_body(tensors: list[tuple[str, str, list[int], bytes]], extra: dict[str, object] | None = None):
    head = {
        "inputs": [
            {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(b)}}
            for n, d, s, b in tensors
        ],
        **(extra or {}),
    }
    raw = json.dumps(head).encode()
    return raw + b"".join(b for *_, b in tensors), str(len(raw))


def test_binary_inputs_are_views_of_the_body() -> None:
    x = np.arange(6, dtype=np.float32)
    y = np.array([b"ab", b"c"], dtype=object)
    from anvil_core.tensors import encode_bytes_elements

    body, hlen = _binary_body(
        [("x", "FP32", [2, 3], x.tobytes()), ("y", "BYTES", [2], encode_bytes_elements(y))]
    )
    parsed = parse_request(body, hlen, None)
    np.testing.assert_array_equal(parsed.inputs[0].data, x.reshape(2, 3))
    assert list(parsed.inputs[1].data) == [b"ab", b"c"]


@pytest.mark.parametrize(
    ("hlen", "match"),
    [("abc", "must be an integer"), ("999999", "must be an integer within"), ("-1", "must be an integer")],
)
def test_bad_header_length(hlen: str, match: str) -> None:
    body, _ = _binary_body([("x", "FP32", [1], b"\x00" * 4)])
    with pytest.raises(BadRequest, match=match):
        parse_request(body, hlen, None)


def test_header_length_cutting_the_json_is_rejected() -> None:
    body, hlen = _binary_body([("x", "FP32", [1], b"\x00" * 4)])
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_request(body, str(int(hlen) - 3), None)


@pytest.mark.parametrize(
    ("declared", "actual", "match"),
    [(8, 4, "exceeds the 4 bytes left"), (4, 8, "binary section holds 8 bytes"), (2, 2, "needs 4")],
)
def test_binary_size_mismatch(declared: int, actual: int, match: str) -> None:
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": declared}}
            ]
        }
    ).encode()
    with pytest.raises(BadRequest, match=match):
        parse_request(head + b"\x00" * actual, str(len(head)), None)


def test_shared_memory_is_refused_where_not_enabled() -> None:
    doc = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1],
                "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
            }
        ]
    }
    with pytest.raises(BadRequest, match="shared memory is not accepted"):
        parse_request(json.dumps(doc).encode(), None, None)


def test_cuda_shared_memory_is_declined_cleanly() -> None:
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from anvil_gateway import routes_shm
    from anvil_gateway.admission import Admission

    app = FastAPI()
    app.include_router(routes_shm.router)
    app.state.gw = SimpleNamespace(admission=Admission(False, 1))  # the routes take the API key
    with TestClient(app) as client:
        assert client.get("/v2/cudasharedmemory/status").json() == []
        assert client.post("/v2/cudasharedmemory/unregister").status_code == 200
        r = client.post("/v2/cudasharedmemory/region/x/register", json={})
        assert r.status_code == 400 and "not supported" in r.json()["error"]
