"""The HTTP client's request and response encoding (binary tensor extension), without a server."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from anvil_client.http_codec import HEADER_LENGTH, InferError, decode_response, encode_request


def _split(headers: dict[str, str], body: bytes) -> tuple[dict, bytes]:
    n = int(headers[HEADER_LENGTH])
    return json.loads(body[:n]), body[n:]


def test_request_header_describes_the_binary_section_in_input_order() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ids = np.array([[1, 2]], dtype=np.int64)
    headers, body = encode_request({"X": x, "IDS": ids}, outputs=["Y"], priority=2, timeout_us=5000)
    doc, binary = _split(headers, body)
    assert [(i["name"], i["datatype"], i["shape"]) for i in doc["inputs"]] == [
        ("X", "FP32", [3, 4]),
        ("IDS", "INT64", [1, 2]),
    ]
    assert [i["parameters"]["binary_data_size"] for i in doc["inputs"]] == [48, 16]
    assert binary == x.tobytes() + ids.tobytes()
    assert doc["outputs"] == [{"name": "Y", "parameters": {"binary_data": True}}]
    assert doc["parameters"] == {"binary_data_output": True, "priority": 2, "timeout": 5000}


def test_strings_travel_as_length_prefixed_bytes_and_non_contiguous_arrays_in_c_order() -> None:
    words = np.array(["ab", "c"])
    headers, body = encode_request({"T": words, "M": np.arange(6, dtype=np.int32).reshape(2, 3).T})
    doc, binary = _split(headers, body)
    assert doc["inputs"][0]["datatype"] == "BYTES"
    assert binary[:11] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c"
    assert binary[11:] == np.ascontiguousarray(np.arange(6, dtype=np.int32).reshape(2, 3).T).tobytes()


def test_a_dtype_without_a_datatype_is_refused_before_sending() -> None:
    with pytest.raises(InferError) as err:
        encode_request({"X": np.zeros(2, dtype=np.uint16)})
    assert err.value.status == 400 and "uint16" in err.value.message
    headers, _ = encode_request({"X": np.zeros(2, dtype=np.uint16)}, datatypes={"X": "BF16"})
    assert int(headers[HEADER_LENGTH]) > 0


def _response(outputs: list[tuple[str, np.ndarray, str]]) -> tuple[dict[str, str], bytes]:
    entries, blobs = [], []
    for name, arr, datatype in outputs:
        raw = arr.tobytes()
        entries.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    head = json.dumps({"model_name": "m", "outputs": entries}).encode()
    return {HEADER_LENGTH: str(len(head))}, head + b"".join(blobs)


def test_binary_outputs_decode_to_writable_arrays_of_their_shape() -> None:
    y = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    z = np.array([7, 8], dtype=np.int32)
    headers, body = _response([("Y", y, "FP32"), ("Z", z, "INT32")])
    out = decode_response(200, headers, body)
    np.testing.assert_array_equal(out["Y"], y)
    np.testing.assert_array_equal(out["Z"], z)
    out["Y"][0, 0] = 1.0  # a copy of the body, not a read-only view


def test_json_outputs_decode_too() -> None:
    doc = {"outputs": [{"name": "Y", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]}]}
    out = decode_response(200, {}, json.dumps(doc).encode())
    assert out["Y"].dtype == np.float32 and out["Y"].tolist() == [[0.5, 1.5]]


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [
        (429, b'{"error": "overloaded: priority 3 shed"}', "overloaded: priority 3 shed"),
        (400, b'{"error": {"message": "bad input", "type": "invalid_request_error"}}', "bad input"),
        (502, b"<html>bad gateway</html>", "<html>bad gateway</html>"),
    ],
)
def test_error_statuses_raise_with_the_servers_message(status: int, body: bytes, text: str) -> None:
    with pytest.raises(InferError) as err:
        decode_response(status, {}, body)
    assert err.value.status == status and err.value.message == text


@pytest.mark.parametrize("cut", [1, 5])
def test_a_truncated_or_inconsistent_reply_is_an_error_not_garbage(cut: int) -> None:
    headers, body = _response([("Y", np.ones(4, dtype=np.float32), "FP32")])
    with pytest.raises(InferError) as err:
        decode_response(200, headers, body[:-cut])
    assert err.value.status == 0 and "unreadable" in err.value.message
    with pytest.raises(InferError):
        decode_response(200, {HEADER_LENGTH: str(len(body) + 1)}, body)
    with pytest.raises(InferError):
        decode_response(200, headers, body + b"x")  # bytes no output claims
