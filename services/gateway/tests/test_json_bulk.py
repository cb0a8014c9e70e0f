"""Large bodies parsed in steps (json_bulk) give what the one-piece parse gives: the same tensors,
or a 400 for what the one-piece parse refuses; on a parse thread (`bulk=True`) or as the event
loop's steps (`json_document_steps`, then `parse_request(..., doc=)`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from anvil_gateway import json_bulk
from anvil_gateway.kserve import BadRequest, ParsedRequest, json_document_steps, parse_request

N = 40_000  # ~0.4-0.8 MB of number text: several steps, each over MIN_SPAN_BYTES


@pytest.fixture(autouse=True)
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_bulk, "STEP_BYTES", 50_000)  # many steps, cut at many commas


def _doc(data: object, datatype: str = "FP32", shape: list[int] | None = None, **extra: object) -> bytes:
    tensor = {"name": "x", "datatype": datatype, "shape": shape or [N], "data": data}
    return json.dumps({"id": "a", "inputs": [tensor], **extra}).encode()


def _loop_steps(body: bytes) -> ParsedRequest:
    """The event loop's way: the JSON parsed and converted by steps, then the request checked."""
    return parse_request(body, None, None, doc=json_bulk.drain(json_document_steps(body)))


def _both(body: bytes) -> tuple[np.ndarray, np.ndarray]:
    plain = parse_request(body, None, None).inputs[0].data
    stepped = parse_request(body, None, None, bulk=True).inputs[0].data
    on_loop = _loop_steps(body).inputs[0].data
    assert on_loop.dtype == stepped.dtype and on_loop.shape == stepped.shape
    np.testing.assert_array_equal(on_loop, stepped)
    return plain, stepped


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "FP16", "BF16", "INT64", "INT8", "UINT8", "BOOL"])
def test_flat_data_parses_as_the_plain_path_does(datatype: str) -> None:
    rng = np.random.default_rng(7)
    if datatype == "BOOL":
        values: list[object] = rng.integers(0, 2, N).astype(bool).tolist()
    elif datatype in ("INT64", "INT8", "UINT8"):
        values = rng.integers(0, 100, N).tolist()
    else:
        values = (rng.standard_normal(N) * 1e3).tolist()
    plain, stepped = _both(_doc(values, datatype))
    assert stepped.dtype == plain.dtype and stepped.shape == plain.shape == (N,)
    np.testing.assert_array_equal(stepped, plain)


def test_nested_data_and_non_finite_numbers() -> None:
    rows = (np.arange(N, dtype=np.float64) / 7).reshape(200, 200).tolist()
    rows[3][4] = float("nan")
    rows[150][0] = float("inf")
    plain, stepped = _both(_doc(rows, shape=[200, 200]))
    np.testing.assert_array_equal(stepped, plain)  # NaN positions equal too
    assert stepped.shape == (200, 200)


def test_the_cut_out_array_is_only_the_data_of_inputs() -> None:
    values = list(range(N))
    body = _doc(values, "INT32", parameters={"data": values, "note": '"data": [1, 2]'})
    got = parse_request(body, None, None, bulk=True)
    assert got.parameters["data"] == values  # a plain list again
    assert got.parameters["note"] == '"data": [1, 2]'
    assert got.inputs[0].data.tolist() == values


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (lambda t: t.replace(b", 5,", b", 5,,", 1), "not valid JSON"),
        (lambda t: t.replace(b", 7,", b", 7 8,", 1), "not valid JSON"),
        (lambda t: t.replace(b"]]", b",]]", 1), "not valid JSON"),
        (lambda t: t.replace(b"], [", b"] [", 1), "not valid JSON"),
        (lambda t: t.replace(b"], [", b", [", 1), "not valid JSON"),
        (lambda t: t.replace(b", 9,", b", 1e999999x,", 1), "not valid JSON"),
    ],
)
def test_malformed_arrays_are_refused(mutate: object, says: str) -> None:
    body = mutate(_doc(np.arange(N).reshape(100, -1).tolist(), "INT32", [100, N // 100]))  # type: ignore[operator]
    with pytest.raises(BadRequest, match=says):
        parse_request(body, None, None)
    with pytest.raises(BadRequest, match=says):
        parse_request(body, None, None, bulk=True)
    with pytest.raises(BadRequest, match=says):
        _loop_steps(body)


@pytest.mark.parametrize("parse", [lambda b: parse_request(b, None, None, bulk=True), _loop_steps])
def test_wrong_counts_and_types_name_the_constraint(parse: object) -> None:
    p: Any = parse
    with pytest.raises(BadRequest, match="more than 100 values given"):
        p(_doc(list(range(N)), "INT32", [100]))
    with pytest.raises(BadRequest, match=f"{N} values given, shape \\[{N + 1}\\]"):
        p(_doc(list(range(N)), "INT32", [N + 1]))
    with pytest.raises(BadRequest, match="BYTES data must be strings"):
        p(_doc(list(range(N)), "BYTES"))
    with pytest.raises(BadRequest, match="within INT8's range"):
        p(_doc([1000] * N, "INT8"))
    with pytest.raises(BadRequest, match="datatype must be one of"):
        p(_doc(list(range(N)), "INT33"))
    with pytest.raises(BadRequest, match="not valid JSON"):
        p(b'{"inputs": [' + b"1, " * N + b"}")
    with pytest.raises(BadRequest, match="must be a JSON object"):
        p(b"[" + b"1, " * N + b"1]")


def test_a_string_that_looks_like_a_data_key_stays_a_string() -> None:
    fake = '"data": [' + ", ".join(["1"] * N) + "]"
    body = _doc(list(range(N)), "INT32", id_note=fake)
    assert b'\\"data\\": [1, 1' in body  # the key's text, escaped inside a string
    got = json_bulk.loads(body)
    assert got["id_note"] == fake
    assert isinstance(got["inputs"][0]["data"], json_bulk.NumberArray)
