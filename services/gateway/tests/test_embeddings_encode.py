"""The OpenAI embeddings body: float32 values round-trip exactly, base64 and non-finite paths."""

from __future__ import annotations

import base64
import json

import numpy as np

from anvil_gateway.embeddings import encode_embeddings


def test_floats_parse_back_to_the_same_float32_values() -> None:
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((5, 384)).astype(np.float32)
    doc = json.loads(encode_embeddings(vecs, "float", "m", 42))
    got = np.array([d["embedding"] for d in doc["data"]], np.float32)
    np.testing.assert_array_equal(got, vecs)
    assert [d["index"] for d in doc["data"]] == list(range(5))
    assert doc["model"] == "m" and doc["usage"] == {"prompt_tokens": 42, "total_tokens": 42}


def test_shortest_spelling_is_smaller_than_the_float64_one() -> None:
    vecs = np.full((1, 8), 0.1, np.float32)
    body = encode_embeddings(vecs, "float", "m", 0)
    assert b"0.1," in body and b"0.10000000149011612" not in body


def test_base64_decodes_to_the_vector() -> None:
    vecs = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    doc = json.loads(encode_embeddings(vecs, "base64", "m", 0))
    row = np.frombuffer(base64.b64decode(doc["data"][1]["embedding"]), "<f4")
    np.testing.assert_array_equal(row, vecs[1])


def test_non_finite_values_are_written_not_nulled() -> None:
    vecs = np.array([[1.0, np.nan, np.inf]], np.float32)
    body = encode_embeddings(vecs, "float", "m", 0)
    assert b"NaN" in body and b"Infinity" in body and b"null" not in body
