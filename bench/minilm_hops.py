"""Where a lone request to the stack spends its time (bench/minilm_gpu.py's "c1 hops"): the services'
per-hop histograms and the executor's GPU phase counters scraped from their /metrics, around a run of
sequential single-sentence KServe requests, with the gateway's per-hop header and Triton statistics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import numpy as np

HOP_METRIC = re.compile(r'^(anvil_\w+_hop_us)_(sum|count)\{hop="(\w+)",priority="(\d)"\} (\S+)$')


def _metric_lines(ports: Iterable[int]) -> Iterator[str]:
    """Every line of each service's /metrics on ``ports`` (those that answer)."""
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        yield from text.splitlines()


def scrape_hops(ports: list[int]) -> dict[str, list[float]]:
    """{"<metric>/<hop>/p<priority>": [sum µs, count]} from the services' per-hop histograms."""
    out: dict[str, list[float]] = {}
    for line in _metric_lines(ports):
        if mm := HOP_METRIC.match(line):
            key = f"{mm[1]}/{mm[3]}/p{mm[4]}"
            out.setdefault(key, [0.0, 0.0])[0 if mm[2] == "sum" else 1] += float(mm[5])
    return out


PHASE_METRIC = re.compile(
    r'^anvil_executor_gpu_(phase_us|runs)_total\{model="([^"]+)"(?:,phase="(\w+)")?\} (\S+)$'
)
EXECUTOR_PORTS = tuple(8004 + 100 * k for k in range(16))  # executor k of `anvil up` (metrics port + 100 k)


def scrape_phases(model: str, ports: tuple[int, ...] = EXECUTOR_PORTS) -> dict[str, float]:
    """{"runs": n, "<phase>": µs} of ``model``'s GPU plan runs so far, over every executor that answers
    (anvil_executor_gpu_phase_us_total / _runs_total: stage, launch, wait, fetch)."""
    out: dict[str, float] = {}
    for line in _metric_lines(ports):
        if (mm := PHASE_METRIC.match(line)) and mm[2] == model:
            key = "runs" if mm[1] == "runs" else mm[3]
            out[key] = out.get(key, 0.0) + float(mm[4])
    return out


def c1_hops(
    url: str,
    name: str,
    texts: list[str],
    n: int = 300,
    ports: tuple[int, ...] = (8003, 8004),
    split_compute: bool = True,
) -> dict[str, Any]:
    """Where a lone single-sentence request spends its time: n sequential KServe infer requests (one
    BYTES row) and the gateway's per-hop header (``x-anvil-hops-us``, µs); medians per hop and of the
    client's round trip (ms), and the scheduler's and executor's own hop means over the same requests.
    ``split_compute``: also the executor's compute_input / infer / output means from the gateway's
    Triton statistics (only right with one gateway process: each HTTP worker keeps its own)."""
    before = scrape_hops(list(ports))
    phases0 = scrape_phases(name)
    with httpx.Client(base_url=url, timeout=30) as cli:
        stats0 = _compute_stats(cli, name) if split_compute else {}
        meta = cli.get(f"/v2/models/{name}").json()
        inp = meta["inputs"][0]["name"]
        hops: dict[str, list[int]] = {}
        lat: list[float] = []
        for i in range(n):
            body = {
                "inputs": [{"name": inp, "shape": [1], "datatype": "BYTES", "data": [texts[i % len(texts)]]}]
            }
            t0 = time.perf_counter()
            r = cli.post(f"/v2/models/{name}/infer", json=body)
            lat.append((time.perf_counter() - t0) * 1e3)
            r.raise_for_status()
            for part in r.headers.get("x-anvil-hops-us", "").split(","):
                if "=" in part:
                    k, v = part.split("=", 1)
                    hops.setdefault(k, []).append(int(v))
        stats1 = _compute_stats(cli, name) if split_compute else {}
    out: dict[str, Any] = {"requests": n, "client_p50_ms": round(float(np.median(lat[n // 10 :])), 3)}
    # the executor's own split of "compute" over the same batches (Triton statistics, means, µs):
    # input = decode + tokenize, infer = the plan's run, output = outputs copied out
    for part, (ns1, count1) in stats1.items():
        ns0, count0 = stats0.get(part, (0, 0))
        if count1 > count0:
            out[f"{part}_mean_us"] = round((ns1 - ns0) / (count1 - count0) / 1000)
    # the GPU plan's runs split by host phase (means per run, µs): stage, launch, wait (the GPU), fetch
    phases1 = scrape_phases(name)
    runs = phases1.get("runs", 0.0) - phases0.get("runs", 0.0)
    if runs > 0:
        out["gpu_runs"] = int(runs)
        for phase in ("stage", "launch", "wait", "fetch"):
            out[f"gpu_{phase}_mean_us"] = round((phases1.get(phase, 0.0) - phases0.get(phase, 0.0)) / runs, 1)
    out.update({f"{k}_p50_us": int(np.median(v[n // 10 :])) for k, v in hops.items()})
    # the scheduler's and executor's own hops over the same requests (means, µs): where "transit" goes
    after = scrape_hops(list(ports))
    for key, (total, count) in after.items():
        s0, c0 = before.get(key, [0.0, 0.0])
        if count > c0:
            out[f"{key}_mean_us"] = round((total - s0) / (count - c0))
    return out


def _compute_stats(cli: httpx.Client, name: str) -> dict[str, tuple[int, int]]:
    """(ns, count) of the model's compute_input / compute_infer / compute_output so far (the
    gateway's Triton statistics); empty when the endpoint does not answer."""
    try:
        doc = cli.get(f"/v2/models/{name}/stats").json()
        inf = doc["model_stats"][0]["inference_stats"]
        parts = ("compute_input", "compute_infer", "compute_output")
        return {p: (int(inf[p]["ns"]), int(inf[p]["count"])) for p in parts}
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return {}
