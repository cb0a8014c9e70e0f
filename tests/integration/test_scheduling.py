"""Scheduling on the real stack, with the `busy` stand-in device (t(B) = base + per_row x B, sleeping):
a burst moves the batch sizes and B* and they settle back; under overload priority 1 keeps its SLO
while priority 3 is shed with a reason; under a burst of batch-class work priority 1 is not queued
behind it at the executor either (issue #19)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from anvil_client.rawhttp import RawHttpPool

pytestmark = pytest.mark.integration


def _body(priority: int) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "parameters": {"priority": priority},
    }


async def _open_loop(
    url: str, rate_rps: float, seconds: float, priority_of: Callable[[int], int]
) -> list[dict[str, Any]]:
    """Send at fixed intervals (open loop: a slow answer does not delay the next send)."""
    results: list[dict[str, Any]] = []
    base, path = url.split("/v2/", 1)
    pool = RawHttpPool(base, size=2048)
    bodies = {p: json.dumps(_body(p)).encode() for p in (1, 2, 3)}

    async def one(i: int, due: float) -> None:
        prio = priority_of(i)
        try:
            r = await pool.request("POST", "/v2/" + path, bodies[prio], {"Content-Type": "application/json"})
            status, text = r.status, r.text
        except (TimeoutError, OSError, ConnectionError) as exc:
            status, text = -1, repr(exc)
        results.append(
            {"i": i, "priority": prio, "status": status, "text": text, "latency_s": time.monotonic() - due}
        )

    start = time.monotonic()
    tasks = []
    for i in range(int(rate_rps * seconds)):
        due = start + i / rate_rps
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the open-loop sender, not waiting for an event
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    await pool.close()
    return results


def _metric(text: str, name: str, labels: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{{labels}\}} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _scheduler_metrics(stack: Any) -> str:
    port = stack.service("scheduler")["env"]["ANVIL_METRICS_PORT"]
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def _mean_batch(text_before: str, text_after: str) -> float:
    lab = 'model="busy"'
    s = _metric(text_after, "anvil_scheduler_batch_size_sum", lab) - _metric(
        text_before, "anvil_scheduler_batch_size_sum", lab
    )
    c = _metric(text_after, "anvil_scheduler_batch_size_count", lab) - _metric(
        text_before, "anvil_scheduler_batch_size_count", lab
    )
    return s / c if c else 0.0


def test_a_burst_raises_the_batch_size_and_it_settles_back(
    new_local_stack: Any, waiter: Any, idle_means_zero: Any
) -> None:
    stack = new_local_stack(
        env={
            "ANVIL_MODELS": "identity,busy",
            "ANVIL_BUSY_BASE_US": "8000",
            "ANVIL_BUSY_PER_ROW_US": "500",
            "ANVIL_MAX_BATCH": "32",
        }
    )
    url = f"{stack.url}/v2/models/busy/infer"
    m0 = _scheduler_metrics(stack)
    calm = asyncio.run(_open_loop(url, 20, 2.0, lambda i: 2))
    m1 = _scheduler_metrics(stack)
    burst = asyncio.run(_open_loop(url, 400, 2.5, lambda i: 3 if i % 10 else 2))
    m2 = _scheduler_metrics(stack)
    after = asyncio.run(_open_loop(url, 20, 2.0, lambda i: 2))
    m3 = _scheduler_metrics(stack)
    calm_b, burst_b, after_b = _mean_batch(m0, m1), _mean_batch(m1, m2), _mean_batch(m2, m3)
    assert all(r["status"] == 200 for r in calm + after), "light load must all succeed"
    assert burst_b >= 3 * max(calm_b, 1.0), (calm_b, burst_b)
    assert after_b <= 1.5 * max(calm_b, 1.0) + 0.5, (calm_b, burst_b, after_b)
    # B* returns to its idle value once the burst is over
    idle_target = _metric(m1, "anvil_scheduler_target_batch", 'model="busy"')
    waiter(
        lambda: (
            _metric(_scheduler_metrics(stack), "anvil_scheduler_target_batch", 'model="busy"') >= idle_target
        ),
        10,
        "B* to settle back",
    )
    answered = [r for r in burst if r["status"] in (200, 429, 503, 504)]
    assert len(answered) == len(burst), {r["status"] for r in burst}
    idle_means_zero(stack)


def test_priority_1_keeps_its_slo_while_priority_3_is_shed(
    new_local_stack: Any, idle_means_zero: Any
) -> None:
    # Time runs 10x slower than production here (SLOs 500 ms / 2 s / 5 s, a device of
    # t(B) = 20 ms + 10 ms x B), so the 2-core CI machine's own CPU is not what overloads.
    stack = new_local_stack(
        env={
            "ANVIL_SLO_P1_MS": "500",
            "ANVIL_SLO_P2_MS": "2000",
            "ANVIL_SLO_P3_MS": "5000",
            "ANVIL_MODELS": "identity,busy",
            "ANVIL_BUSY_BASE_US": "20000",
            "ANVIL_BUSY_PER_ROW_US": "10000",
            "ANVIL_MAX_BATCH": "8",
            "ANVIL_CREDITS": "1",
            # the scheduler's shedding is under test: the gateway's own (by its event loop's delay,
            # thresholds in real-time ms that the 10x slower clock here does not scale) stays off
            "ANVIL_SHED_DELAY_MS_P2": "0",
            "ANVIL_SHED_DELAY_MS_P3": "0",
        }
    )
    url = f"{stack.url}/v2/models/busy/infer"
    # capacity = 8 / 100 ms = 80 req/s; offer ~3.5x that for 3 s, 1 request in 20 at priority 1
    results = asyncio.run(_open_loop(url, 280, 3.0, lambda i: 1 if i % 20 == 0 else 3))
    p1 = [r for r in results if r["priority"] == 1]
    p3 = [r for r in results if r["priority"] == 3]
    ok1 = [r for r in p1 if r["status"] == 200]
    assert len(ok1) >= 0.99 * len(p1), [(r["status"], r["text"][:80]) for r in p1 if r["status"] != 200]
    shed3 = [r for r in p3 if r["status"] in (429, 504)]
    assert len(shed3) >= 0.2 * len(p3), "overload must shed priority 3"
    assert all("shed" in r["text"] for r in shed3), {r["text"][:60] for r in shed3}
    assert all(r["status"] in (200, 429, 504) for r in results), {r["status"] for r in results}
    sched = _scheduler_metrics(stack)
    shed_metric = sum(
        _metric(sched, "anvil_scheduler_shed_total", f'model="busy",priority="3",reason="{reason}"')
        for reason in ("deadline", "overload")
    )
    assert shed_metric == len(shed3)
    idle_means_zero(stack)


def _hop_mean_us(text: str, hop: str, priority: str) -> float:
    labels = f'hop="{hop}",priority="{priority}"'
    got = {}
    for kind in ("sum", "count"):
        m = re.search(rf"^anvil_executor_hop_us_{kind}\{{{labels}\}} ([0-9.e+-]+)$", text, re.M)
        got[kind] = float(m.group(1)) if m else 0.0
    return got["sum"] / got["count"] if got["count"] else float("nan")


def test_priority_1_is_not_queued_behind_batch_class_batches(
    new_local_stack: Any, idle_means_zero: Any
) -> None:
    stack = new_local_stack(
        env={
            "ANVIL_SLO_P1_MS": "500",
            "ANVIL_SLO_P2_MS": "2000",
            "ANVIL_SLO_P3_MS": "5000",
            "ANVIL_MODELS": "identity,busy",
            "ANVIL_BUSY_BASE_US": "20000",
            "ANVIL_BUSY_PER_ROW_US": "10000",
            "ANVIL_MAX_BATCH": "8",
            "ANVIL_CREDITS": "2",
            "ANVIL_SHED_DELAY_MS_P2": "0",  # real-time thresholds: off under the 10x slower clock
            "ANVIL_SHED_DELAY_MS_P3": "0",
        }
    )
    url = f"{stack.url}/v2/models/busy/infer"
    # capacity = 8 / 100 ms = 80 req/s: offer 2x that for 4 s, one request in 32 at priority 1 (one per
    # 5 batches: most batches are batch-class only, and those are what priority 1 must overtake)
    results = asyncio.run(_open_loop(url, 160, 4.0, lambda i: 1 if i % 32 == 0 else 3))
    p1 = [r for r in results if r["priority"] == 1]
    p3 = [r for r in results if r["priority"] == 3]
    ok1 = [r["latency_s"] for r in p1 if r["status"] == 200]
    ok3 = [r["latency_s"] for r in p3 if r["status"] == 200]
    # the SLO itself is the overload test's (above); here the ordering is, so a loaded CI machine's
    # stray timeout does not fail it
    assert len(ok1) >= 0.9 * len(p1), [(r["status"], r["text"][:80]) for r in p1 if r["status"] != 200]
    assert ok3, "some batch-class work must be served for the comparison"
    assert np.percentile(ok1, 90) < np.percentile(ok3, 50), (np.percentile(ok1, 90), np.percentile(ok3, 50))
    # At the executor: a batch led by priority 1 overtakes the queued batch-class one (reserved credit,
    # most urgent first), so it waits for the running batch only; a priority-3 batch waits for a whole one.
    port = stack.service("executor")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    waited1, waited3 = _hop_mean_us(text, "queued", "1"), _hop_mean_us(text, "queued", "3")
    assert waited1 < 0.75 * waited3, (waited1, waited3)
    idle_means_zero(stack)
