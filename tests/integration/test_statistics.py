"""`/v2/models/{m}/stats` in Triton's meaning against the real stack: concurrent requests that the
scheduler batches count one execution per batch, one inference per row, a batch_stats entry per
batch size, and durations measured by the executor and the scheduler that fit inside what the
client measured."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from anvil_client.launcher import PORT_STRIDE

pytestmark = pytest.mark.integration

ROUNDS, CONCURRENCY = 4, 24  # 96 requests: concurrent enough that the scheduler forms batches


def _served(port: int) -> float:
    """Successful mlp inferences one gateway worker counted (its /metrics)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("anvil_inference_request_success_total{") and 'model="mlp"' in line
    )


def _stats(http: httpx.Client, path: str = "/v2/models/mlp/stats") -> dict[str, Any]:
    r = http.get(path)
    assert r.status_code == 200, r.text
    (doc,) = r.json()["model_stats"]
    return doc  # type: ignore[no-any-return]


async def _burst(url: str, rows: list[int], shedding: Any) -> list[int]:
    """One round of concurrent requests (a shed one sent again as advised: a shed request is never
    counted); each one's client-side latency, ns."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(n: int) -> int:
            body = {
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n, 16], "data": [0.25] * 16 * n}],
                "parameters": {"priority": 3},  # the batch class: the longest SLO on a busy machine
            }
            t0 = time.perf_counter_ns()
            r = await shedding.acall(lambda: client.post("/v2/models/mlp/infer", json=body))
            took = time.perf_counter_ns() - t0
            assert r.status_code == 200, r.text
            return took

        return list(await asyncio.gather(*(one(n) for n in rows)))


def test_batched_requests_count_executions_per_batch_and_inferences_per_row(
    stack: Any, http: httpx.Client, through_shedding: Any
) -> None:
    url = stack.url if hasattr(stack, "url") else stack.gateway_url
    rows = [1 + (i % 3 == 0) for i in range(CONCURRENCY)]  # some requests carry 2 rows
    before = _stats(http)
    latencies: list[int] = []
    for _ in range(ROUNDS):
        latencies += asyncio.run(_burst(url, rows, through_shedding))
    after = _stats(http)

    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == ROUNDS * sum(rows)
    assert 0 < executions < ROUNDS * CONCURRENCY  # batches, not requests: some carried several
    counts_before = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    batches = {
        b["batch_size"]: b["compute_infer"]["count"] - counts_before.get(b["batch_size"], 0)
        for b in after["batch_stats"]
    }
    assert sum(batches.values()) == executions
    assert sum(size * count for size, count in batches.items()) == inferences
    assert any(size > 2 and count > 0 for size, count in batches.items())
    for b in after["batch_stats"]:  # perf_analyzer needs the three counts equal
        assert b["compute_input"]["count"] == b["compute_infer"]["count"] == b["compute_output"]["count"]

    s0, s1 = before["inference_stats"], after["inference_stats"]
    delta = {k: {f: s1[k][f] - s0[k][f] for f in ("count", "ns")} for k in s1}
    n = ROUNDS * CONCURRENCY
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert delta[key]["count"] == n, key
        assert delta[key]["ns"] > 0, key
    assert delta["fail"]["count"] == through_shedding.shed  # a shed answer counts as a failure
    server_side = sum(delta[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert server_side <= delta["success"]["ns"] <= sum(latencies)


def test_stats_of_a_version_and_of_unknown_models(http: httpx.Client) -> None:
    doc = _stats(http)
    assert _stats(http, f"/v2/models/mlp/versions/{doc['version']}/stats")["name"] == "mlp"
    assert http.get("/v2/models/no-such-model/stats").status_code == 404
    assert http.get("/v2/models/mlp/versions/no-such-version/stats").status_code == 404
    names = {d["name"] for d in http.get("/v2/models/stats").json()["model_stats"]}
    assert "no-such-model" not in names and "mlp" in names


def test_every_gateway_worker_answers_with_the_totals(
    new_local_stack: Callable[..., Any], waiter: Callable[..., float]
) -> None:
    """ANVIL_HTTP_WORKERS=2: requests land on both workers; each worker's stats add the other's
    published share, so any of them answers with all the requests (within a heartbeat)."""
    stack = new_local_stack(env={"ANVIL_HTTP_WORKERS": "2"})
    n = 40
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    for _ in range(n):  # a new connection each time: the kernel spreads them over the two workers
        with httpx.Client(base_url=stack.url, timeout=10) as c:
            assert c.post("/v2/models/mlp/infer", json=body).status_code == 200

    metrics = int(stack.service("gateway")["env"]["ANVIL_METRICS_PORT"])
    shares = [_served(metrics), _served(metrics + PORT_STRIDE)]
    assert sum(shares) == n and min(shares) > 0, shares  # each worker alone saw only its share

    def totals() -> list[dict[str, Any]]:
        docs = []
        for _ in range(6):  # new connections: both workers answer some of these
            with httpx.Client(base_url=stack.url, timeout=10) as c:
                docs.append(_stats(c))
        return docs

    def all_see_everything() -> bool:
        return all(d["inference_stats"]["success"]["count"] == n for d in totals())

    waiter(all_see_everything, 15, "every worker's stats to count all the requests")
    for doc in totals():
        assert doc["inference_count"] == n
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in doc["batch_stats"]}
        assert sum(sizes.values()) == doc["execution_count"] <= n
        assert sum(size * count for size, count in sizes.items()) == n
